//! What the source's benchmarks share: a bare repository that takes whole commits.

use git2::{Oid, Repository, Signature};
use std::collections::BTreeMap;

/// A bare repository whose `main` gets one commit of all `files` per call.
pub struct Repo {
    _tmp: tempfile::TempDir,
    pub path: std::path::PathBuf,
}

impl Repo {
    pub fn new() -> Self {
        let tmp = tempfile::TempDir::new().unwrap();
        let path = tmp.path().join("bench.git");
        Repository::init_bare(&path).unwrap();
        Repo { _tmp: tmp, path }
    }

    pub fn commit(&self, files: &BTreeMap<String, String>) {
        #[derive(Default)]
        struct Dir {
            blobs: BTreeMap<String, Oid>,
            dirs: BTreeMap<String, Dir>,
        }
        fn write(repo: &Repository, dir: &Dir) -> Oid {
            let mut builder = repo.treebuilder(None).unwrap();
            for (name, oid) in &dir.blobs {
                builder.insert(name, *oid, 0o100644).unwrap();
            }
            for (name, sub) in &dir.dirs {
                builder.insert(name, write(repo, sub), 0o040000).unwrap();
            }
            builder.write().unwrap()
        }
        let repo = Repository::open_bare(&self.path).unwrap();
        let mut root = Dir::default();
        for (path, text) in files {
            let mut parts: Vec<&str> = path.split('/').collect();
            let name = parts.pop().unwrap();
            let dir = parts.into_iter().fold(&mut root, |d, p| d.dirs.entry(p.to_owned()).or_default());
            dir.blobs.insert(name.to_owned(), repo.blob(text.as_bytes()).unwrap());
        }
        let tree = repo.find_tree(write(&repo, &root)).unwrap();
        let sig = Signature::now("t", "t@example.com").unwrap();
        let parent = repo.find_reference("refs/heads/main").ok().and_then(|r| r.peel_to_commit().ok());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "change", &tree, &parents).unwrap();
    }
}
