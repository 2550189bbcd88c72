//! Manifest files of a commit, read from the Git object database (never a checkout), or of a
//! plain directory.
//!
//! Files are the blobs named `*.yaml` / `*.yml` (and templates, `*.yaml.j2` / `*.yml.j2`) under
//! a directory, recursively, sorted by path. Sizes are checked before reading; a symlink is
//! followed only to a file inside the directory, resolved within the commit's tree (or within the
//! directory on disk); submodules are skipped.
//!
//! The walk of a tree reads no blob: it lists paths, blob ids and sizes (from object headers, or
//! from the cache for blobs it already holds). [`read_commit`] then reads every blob;
//! [`crate::load_commit`] reads only those its cache lacks, which is what makes a one-file
//! change cheap in a repository of many files.

use crate::{Limits, ManifestFile, SourceError};
use git2::{ErrorCode, ObjectType, Odb, Oid, Reference, Repository, RepositoryOpenFlags, Tree};
use std::{
    ffi::OsStr,
    fs,
    io::{self, Read},
    path::{Path, PathBuf},
};

/// A manifest or values file found under the Application's path, not read yet.
pub(crate) struct Candidate {
    /// Relative to the repository root (or the directory), `/`-separated.
    pub(crate) path: String,
    /// The blob id (for a file on disk: the id Git would give its bytes; zero: not cacheable).
    pub(crate) blob: Oid,
    pub(crate) size: u64,
}

/// Links followed from one manifest before giving up (Linux allows 40; manifests need few).
const MAX_SYMLINK_HOPS: usize = 8;
/// A symlink's target is a path: longer blobs are not targets.
const MAX_SYMLINK_TARGET: usize = 4096;

const MODE_TREE: i32 = 0o040000;
const MODE_BLOB: i32 = 0o100644;
const MODE_EXECUTABLE: i32 = 0o100755;
const MODE_SYMLINK: i32 = 0o120000;

/// The manifests of a branch head.
#[derive(Clone, Debug)]
pub struct Commit {
    /// Full hex id.
    pub id: String,
    /// First line of the message.
    pub subject: String,
    pub files: Vec<ManifestFile>,
}

/// A branch head, resolved but not read: cheap, to tell whether a commit was handled already;
/// [`crate::load_commit`] reads it.
#[derive(Clone, Debug)]
pub struct Head {
    /// Full hex id.
    pub id: String,
    /// First line of the message.
    pub subject: String,
    repo: PathBuf,
    commit: Oid,
}

impl Head {
    /// The repository it is the head of.
    pub fn repo(&self) -> &Path {
        &self.repo
    }
}

/// Reads the manifest files under `dir` (empty: the root) of the head of `branch`.
pub fn read_commit(repo: &Path, branch: &str, dir: &str, limits: &Limits) -> Result<Commit, SourceError> {
    let repository = open(repo)?;
    let head = head_of(&repository, repo, branch)?;
    let opened = Opened::new(&repository, &head);
    let mut candidates = opened.walk(dir, limits)?;
    let known = vec![None; candidates.len()];
    opened.sizes(&mut candidates, &known, limits)?;
    let mut files = Vec::with_capacity(candidates.len());
    for candidate in candidates {
        let content = opened.read(&candidate)?;
        files.push(ManifestFile { path: candidate.path, blob: candidate.blob, content });
    }
    tracing::debug!(repo = %repo.display(), %branch, commit = %head.id, files = files.len(), "read manifests");
    Ok(Commit { id: head.id, subject: head.subject, files })
}

/// Resolves the head of `branch`.
pub fn read_head(repo: &Path, branch: &str) -> Result<Head, SourceError> {
    head_of(&open(repo)?, repo, branch)
}

/// A commit by id in an open repository, as if it were a branch head: what a push brings before
/// its ref moves (the pre-receive verdict reads the pushed commit, never the branch).
pub fn head_at(repository: &Repository, repo: &Path, commit: Oid) -> Result<Head, SourceError> {
    let git = |source| SourceError::Git { repo: repo_name(repo), what: commit.to_string(), source };
    let found = repository.find_commit(commit).map_err(git)?;
    let message = String::from_utf8_lossy(found.message_bytes());
    let subject = message.lines().next().unwrap_or("").trim().to_owned();
    Ok(Head { id: commit.to_string(), subject, repo: repo.to_owned(), commit })
}

/// Resolves the head of `branch` in an open repository (refs are read anew on every call).
pub(crate) fn head_of(repository: &Repository, repo: &Path, branch: &str) -> Result<Head, SourceError> {
    let name = repo_name(repo);
    let refname = format!("refs/heads/{branch}");
    // A NUL would panic inside git2's name check.
    if branch.contains('\0') || !Reference::is_valid_name(&refname) {
        return Err(SourceError::InvalidBranch { branch: branch.to_owned() });
    }
    let git = |source| SourceError::Git { repo: name.clone(), what: refname.clone(), source };
    let reference = repository.find_reference(&refname).map_err(|source| match source.code() {
        ErrorCode::NotFound => SourceError::NoBranch { repo: name.clone(), branch: branch.to_owned() },
        _ => git(source),
    })?;
    let commit = reference.peel_to_commit().map_err(git)?;
    let message = String::from_utf8_lossy(commit.message_bytes());
    let subject = message.lines().next().unwrap_or("").trim().to_owned();
    Ok(Head { id: commit.id().to_string(), subject, repo: repo.to_owned(), commit: commit.id() })
}

pub(crate) fn open(repo: &Path) -> Result<Repository, SourceError> {
    // NO_SEARCH: a missing repository must not open whatever repository encloses the path.
    Repository::open_ext(repo, RepositoryOpenFlags::NO_SEARCH, std::iter::empty::<&OsStr>()).map_err(|source| {
        match source.code() {
            ErrorCode::NotFound => SourceError::RepositoryNotFound { repo: repo.to_owned(), source },
            _ => SourceError::OpenRepository { repo: repo.to_owned(), source },
        }
    })
}

/// The repository of a [`Head`], open for walking its tree and reading its blobs.
pub(crate) struct Opened<'r> {
    repository: &'r Repository,
    /// The repository as errors name it.
    name: String,
    id: String,
    commit: Oid,
}

impl<'r> Opened<'r> {
    pub(crate) fn new(repository: &'r Repository, head: &Head) -> Self {
        Opened { repository, name: repo_name(&head.repo), id: head.id.clone(), commit: head.commit }
    }

    fn git_error(&self, what: &str) -> impl FnOnce(git2::Error) -> SourceError {
        let (repo, what) = (self.name.clone(), what.to_owned());
        move |source| SourceError::Git { repo, what, source }
    }

    /// The manifest files under `dir`, sorted by path, sizes not known yet (zero).
    pub(crate) fn walk(&self, dir: &str, limits: &Limits) -> Result<Vec<Candidate>, SourceError> {
        self.walk_files(dir, limits, false)
    }

    /// Every file under `dir` (for a kustomization), or only those named as manifests.
    pub(crate) fn walk_files(
        &self,
        dir: &str,
        limits: &Limits,
        every_file: bool,
    ) -> Result<Vec<Candidate>, SourceError> {
        let dir = normalize_dir(dir)?;
        let commit = self.repository.find_commit(self.commit).map_err(self.git_error(&self.id))?;
        let root = commit.tree().map_err(self.git_error(&format!("the tree of commit {}", self.id)))?;
        let start = if dir.is_empty() {
            root.id()
        } else {
            let short = self.id.get(..12).unwrap_or(&self.id).to_owned();
            let entry = root.get_path(Path::new(&dir)).map_err(|source| match source.code() {
                ErrorCode::NotFound => {
                    SourceError::DirNotFound { repo: self.name.clone(), commit: short.clone(), dir: dir.clone() }
                }
                _ => self.git_error(&dir)(source),
            })?;
            if entry.filemode() != MODE_TREE {
                return Err(SourceError::NotADirectory { repo: self.name.clone(), commit: short, dir });
            }
            entry.id()
        };
        let odb = self.repository.odb().map_err(self.git_error("the object database"))?;
        let mut reader = TreeReader {
            repo: self.repository,
            odb,
            root,
            dir,
            name: self.name.clone(),
            limits,
            entries: 0,
            files: Vec::new(),
            every_file,
        };
        reader.walk(start)?;
        let mut files = reader.files;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// Sets the size of each candidate (sorted by path), from `known` (what the cache holds: a
    /// blob id names its bytes) or else from the object's header, and checks them against the
    /// limits, before any blob is read.
    pub(crate) fn sizes(
        &self,
        candidates: &mut [Candidate],
        known: &[Option<u64>],
        limits: &Limits,
    ) -> Result<(), SourceError> {
        let odb = self.repository.odb().map_err(self.git_error("the object database"))?;
        let mut total = 0;
        for (candidate, known) in candidates.iter_mut().zip(known) {
            candidate.size = match *known {
                Some(size) => size,
                // A header read opens a file for a loose object: only for blobs not seen before.
                None => {
                    let (size, kind) = odb.read_header(candidate.blob).map_err(self.git_error(&candidate.path))?;
                    if kind != ObjectType::Blob {
                        let e = git2::Error::from_str("the tree entry is not a blob");
                        return Err(self.git_error(&candidate.path)(e));
                    }
                    size as u64
                }
            };
            check_size(limits, &mut total, &candidate.path, candidate.size)?;
        }
        Ok(())
    }

    /// The blob at `path` (relative to the root, symlinks followed inside the repository), if
    /// there is a file there: for values files outside the walked directory.
    pub(crate) fn blob_at(&self, path: &str) -> Result<Option<Oid>, SourceError> {
        let commit = self.repository.find_commit(self.commit).map_err(self.git_error(&self.id))?;
        let root = commit.tree().map_err(self.git_error(&format!("the tree of commit {}", self.id)))?;
        let entry = match root.get_path(Path::new(path)) {
            Ok(entry) => entry,
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(self.git_error(path)(e)),
        };
        let odb = self.repository.odb().map_err(self.git_error("the object database"))?;
        let limits = Limits::default();
        let reader = TreeReader {
            repo: self.repository,
            odb,
            root,
            dir: String::new(),
            name: self.name.clone(),
            limits: &limits,
            entries: 0,
            files: Vec::new(),
            every_file: false,
        };
        match entry.filemode() {
            MODE_BLOB | MODE_EXECUTABLE => Ok(Some(entry.id())),
            MODE_SYMLINK => reader.follow(path, entry.id()).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether `dir` is a directory of the commit.
    pub(crate) fn is_dir(&self, dir: &str) -> bool {
        let Ok(commit) = self.repository.find_commit(self.commit) else { return false };
        let Ok(root) = commit.tree() else { return false };
        dir.is_empty() || root.get_path(Path::new(dir)).is_ok_and(|entry| entry.filemode() == MODE_TREE)
    }

    /// The bytes of a file the walk found (and [`Self::sizes`] checked).
    pub(crate) fn read(&self, candidate: &Candidate) -> Result<Vec<u8>, SourceError> {
        let blob = self.repository.find_blob(candidate.blob).map_err(self.git_error(&candidate.path))?;
        Ok(blob.content().to_vec())
    }
}

/// `demo.git` for `/srv/repos/demo.git`: how users name their repository.
fn repo_name(repo: &Path) -> String {
    repo.file_name().map_or_else(|| repo.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// `deploy/prod` for `/deploy/prod/`, `./deploy` or `deploy//prod`; `..` is refused.
pub(crate) fn normalize_dir(dir: &str) -> Result<String, SourceError> {
    let parts: Vec<_> = dir.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if dir.contains('\0') || parts.contains(&"..") {
        return Err(SourceError::InvalidDir { dir: dir.to_owned() });
    }
    Ok(parts.join("/"))
}

fn is_manifest(name: &[u8]) -> bool {
    [b".yaml".as_slice(), b".yml", b".yaml.j2", b".yml.j2"].iter().any(|suffix| name.ends_with(suffix))
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_owned() } else { format!("{prefix}/{name}") }
}

/// Resolves a relative symlink `target` from the link at `link` (both `/`-separated, relative to
/// the root); `None` if it climbs above the root.
fn resolve_link(link: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = link.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            _ => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// Whether the file at `path` is under `dir` (empty: the root).
fn inside(dir: &str, path: &str) -> bool {
    dir.is_empty() || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

struct TreeReader<'r> {
    repo: &'r Repository,
    odb: Odb<'r>,
    root: Tree<'r>,
    dir: String,
    /// The repository as errors name it.
    name: String,
    limits: &'r Limits,
    entries: usize,
    files: Vec<Candidate>,
    /// Every file, not only those named as manifests: what a kustomization may read.
    every_file: bool,
}

impl TreeReader<'_> {
    fn git_error(&self, what: &str) -> impl FnOnce(git2::Error) -> SourceError {
        let (repo, what) = (self.name.clone(), what.to_owned());
        move |source| SourceError::Git { repo, what, source }
    }

    fn shown_dir(&self) -> String {
        if self.dir.is_empty() { "the repository root".into() } else { self.dir.clone() }
    }

    /// Walks the trees under `start` with an explicit stack (no recursion on hostile input).
    fn walk(&mut self, start: Oid) -> Result<(), SourceError> {
        // (tree, its path, whether that path is UTF-8)
        let mut stack = vec![(start, self.dir.clone(), true)];
        while let Some((oid, prefix, utf8)) = stack.pop() {
            let tree = self.repo.find_tree(oid).map_err(self.git_error(&prefix))?;
            for entry in tree.iter() {
                self.entries += 1;
                if self.entries > self.limits.max_tree_entries {
                    return Err(SourceError::TooManyEntries {
                        dir: self.shown_dir(),
                        limit: self.limits.max_tree_entries,
                    });
                }
                let bytes = entry.name_bytes();
                let (name, name_utf8) = match std::str::from_utf8(bytes) {
                    Ok(name) => (name.to_owned(), true),
                    Err(_) => (String::from_utf8_lossy(bytes).into_owned(), false),
                };
                let path = join(&prefix, &name);
                let mode = entry.filemode();
                if mode == MODE_TREE {
                    stack.push((entry.id(), path, utf8 && name_utf8));
                    continue;
                }
                // Submodules (commits), and anything not named as a manifest, are not read.
                if !(self.every_file || is_manifest(bytes))
                    || ![MODE_BLOB, MODE_EXECUTABLE, MODE_SYMLINK].contains(&mode)
                {
                    continue;
                }
                if !(utf8 && name_utf8) {
                    return Err(SourceError::NonUtf8Path { file: path });
                }
                if self.files.len() >= self.limits.max_documents {
                    return Err(SourceError::TooManyFiles { dir: self.shown_dir(), limit: self.limits.max_documents });
                }
                let blob = if mode == MODE_SYMLINK { self.follow(&path, entry.id())? } else { entry.id() };
                self.files.push(Candidate { path, blob, size: 0 });
            }
        }
        Ok(())
    }

    /// The blob a symlink at `link` leads to, through at most [`MAX_SYMLINK_HOPS`] links, all
    /// inside the directory.
    fn follow(&self, link: &str, mut oid: Oid) -> Result<Oid, SourceError> {
        let mut current = link.to_owned();
        for _ in 0..MAX_SYMLINK_HOPS {
            let target = self.symlink_target(link, oid)?;
            let broken = || SourceError::SymlinkBroken { file: link.to_owned(), target: target.clone() };
            if target.starts_with('/') {
                return Err(SourceError::SymlinkAbsolute { file: link.to_owned(), target, dir: self.shown_dir() });
            }
            let resolved = match resolve_link(&current, &target) {
                Some(resolved) if inside(&self.dir, &resolved) => resolved,
                _ => return Err(SourceError::SymlinkEscapes { file: link.to_owned(), target, dir: self.shown_dir() }),
            };
            let entry = match self.root.get_path(Path::new(&resolved)) {
                Ok(entry) => entry,
                Err(e) if e.code() == ErrorCode::NotFound => return Err(broken()),
                Err(e) => return Err(self.git_error(&resolved)(e)),
            };
            match entry.filemode() {
                MODE_BLOB | MODE_EXECUTABLE => return Ok(entry.id()),
                MODE_SYMLINK => {
                    current = resolved;
                    oid = entry.id();
                }
                _ => return Err(SourceError::SymlinkNotFile { file: link.to_owned(), target }),
            }
        }
        Err(SourceError::SymlinkLoop { file: link.to_owned(), hops: MAX_SYMLINK_HOPS })
    }

    fn symlink_target(&self, link: &str, oid: Oid) -> Result<String, SourceError> {
        let (size, _) = self.odb.read_header(oid).map_err(self.git_error(link))?;
        if size > MAX_SYMLINK_TARGET {
            return Err(SourceError::SymlinkBroken { file: link.to_owned(), target: "a path over 4 KiB".into() });
        }
        let blob = self.repo.find_blob(oid).map_err(self.git_error(link))?;
        String::from_utf8(blob.content().to_vec()).map_err(|_| SourceError::NonUtf8Path { file: link.to_owned() })
    }
}

/// Counts a file of `size` bytes against the limits, before it is read.
pub(crate) fn check_size(limits: &Limits, total: &mut u64, file: &str, size: u64) -> Result<(), SourceError> {
    if size > limits.max_file_bytes {
        return Err(SourceError::FileTooLarge { file: file.to_owned(), size, limit: limits.max_file_bytes });
    }
    *total = total.saturating_add(size);
    if *total > limits.max_total_bytes {
        return Err(SourceError::TotalTooLarge { file: file.to_owned(), limit: limits.max_total_bytes });
    }
    Ok(())
}

/// The bytes of the file at `path` (relative to `root`), if there is one: a regular file whose
/// real path is inside `root`, within the per-file limit. For values files named explicitly.
pub(crate) fn read_file_under(root: &Path, path: &str, limits: &Limits) -> Result<Option<Vec<u8>>, SourceError> {
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| SourceError::Io { path, source }
    };
    let canonical_root = fs::canonicalize(root).map_err(io_error(root))?;
    let full = root.join(path);
    let real = match fs::canonicalize(&full) {
        Ok(real) => real,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SourceError::Io { path: full, source: e }),
    };
    if !real.starts_with(&canonical_root) {
        let target = real.display().to_string();
        return Err(SourceError::SymlinkEscapes { file: path.to_owned(), target, dir: root.display().to_string() });
    }
    let mut reader =
        DirReader { root: canonical_root, shown: root.display().to_string(), limits, total: 0, files: Vec::new() };
    match fs::metadata(&real) {
        Ok(meta) if meta.is_file() => reader.read_file(path, &real).map(Some),
        _ => Ok(None),
    }
}

/// Reads the manifest files under a plain directory, by the rules of [`read_commit`]: for
/// `gitplane validate DIR`. Paths are relative to `dir`; `.git` directories are skipped;
/// symlinks are followed only to regular files inside `dir`.
pub fn read_dir(dir: &Path, limits: &Limits) -> Result<Vec<ManifestFile>, SourceError> {
    read_files(dir, limits, false)
}

/// [`read_dir`], of every file (for a kustomization) or only of those named as manifests.
pub(crate) fn read_files(dir: &Path, limits: &Limits, every_file: bool) -> Result<Vec<ManifestFile>, SourceError> {
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| SourceError::Io { path, source }
    };
    if !fs::metadata(dir).map_err(io_error(dir))?.is_dir() {
        return Err(SourceError::NotADirectoryOnDisk { dir: dir.to_owned() });
    }
    let root = fs::canonicalize(dir).map_err(io_error(dir))?;
    let mut reader = DirReader { root, shown: dir.display().to_string(), limits, total: 0, files: Vec::new() };
    let mut stack = vec![(String::new(), true)];
    let mut walked = 0;
    while let Some((prefix, utf8)) = stack.pop() {
        let here = reader.root.join(&prefix);
        let mut entries =
            fs::read_dir(&here).and_then(|entries| entries.collect::<io::Result<Vec<_>>>()).map_err(io_error(&here))?;
        entries.sort_by_key(|e| e.file_name());
        walked += entries.len();
        if walked > limits.max_tree_entries {
            return Err(SourceError::TooManyEntries { dir: reader.shown, limit: limits.max_tree_entries });
        }
        for entry in entries {
            let file_name = entry.file_name();
            let (name, name_utf8) = match file_name.to_str() {
                Some(name) => (name.to_owned(), true),
                None => (file_name.to_string_lossy().into_owned(), false),
            };
            let path = join(&prefix, &name);
            // Does not follow symlinks: a symlinked directory is not walked, as in Git.
            let kind = entry.file_type().map_err(io_error(&entry.path()))?;
            if kind.is_dir() {
                if name != ".git" {
                    stack.push((path, utf8 && name_utf8));
                }
                continue;
            }
            if !(every_file || is_manifest(file_name.as_encoded_bytes())) || !(kind.is_file() || kind.is_symlink()) {
                continue;
            }
            if !(utf8 && name_utf8) {
                return Err(SourceError::NonUtf8Path { file: path });
            }
            if reader.files.len() >= limits.max_documents {
                return Err(SourceError::TooManyFiles { dir: reader.shown.clone(), limit: limits.max_documents });
            }
            let real = if kind.is_symlink() { reader.follow(&path)? } else { reader.root.join(&path) };
            let content = reader.read_file(&path, &real)?;
            reader.files.push(ManifestFile::new(path, content));
        }
    }
    let mut files = reader.files;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

struct DirReader<'l> {
    /// Canonical: every file read must be under it.
    root: PathBuf,
    /// The directory as the user wrote it.
    shown: String,
    limits: &'l Limits,
    total: u64,
    files: Vec<ManifestFile>,
}

impl DirReader<'_> {
    /// The regular file a symlink at `link` (relative to the root) leads to, inside the root.
    fn follow(&self, link: &str) -> Result<PathBuf, SourceError> {
        let io_error = |path: PathBuf| move |source| SourceError::Io { path, source };
        let mut current = link.to_owned();
        for _ in 0..MAX_SYMLINK_HOPS {
            let at = self.root.join(&current);
            let target = fs::read_link(&at).map_err(io_error(at))?;
            let shown = target.to_string_lossy().into_owned();
            let escapes = || SourceError::SymlinkEscapes {
                file: link.to_owned(),
                target: shown.clone(),
                dir: self.shown.clone(),
            };
            if target.is_absolute() {
                return Err(SourceError::SymlinkAbsolute {
                    file: link.to_owned(),
                    target: shown,
                    dir: self.shown.clone(),
                });
            }
            let Some(target) = target.to_str() else {
                return Err(SourceError::NonUtf8Path { file: link.to_owned() });
            };
            let resolved = resolve_link(&current, target).ok_or_else(escapes)?;
            let full = self.root.join(&resolved);
            let meta = match fs::symlink_metadata(&full) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(SourceError::SymlinkBroken { file: link.to_owned(), target: shown });
                }
                Err(e) => return Err(SourceError::Io { path: full, source: e }),
            };
            if meta.is_symlink() {
                current = resolved;
                continue;
            }
            if !meta.is_file() {
                return Err(SourceError::SymlinkNotFile { file: link.to_owned(), target: shown });
            }
            // A directory on the way may itself be a symlink leading out: check the real path.
            let real = fs::canonicalize(&full).map_err(io_error(full))?;
            if !real.starts_with(&self.root) {
                return Err(escapes());
            }
            return Ok(real);
        }
        Err(SourceError::SymlinkLoop { file: link.to_owned(), hops: MAX_SYMLINK_HOPS })
    }

    /// Reads a regular file, its size checked first and its read bounded (it may be growing).
    fn read_file(&mut self, file: &str, real: &Path) -> Result<Vec<u8>, SourceError> {
        let io_error = |source| SourceError::Io { path: real.to_owned(), source };
        let handle = fs::File::open(real).map_err(io_error)?;
        let meta = handle.metadata().map_err(io_error)?;
        if !meta.is_file() {
            return Err(io_error(io::Error::other("not a regular file")));
        }
        check_size(self.limits, &mut self.total, file, meta.len())?;
        let mut content = Vec::new();
        handle.take(self.limits.max_file_bytes.saturating_add(1)).read_to_end(&mut content).map_err(io_error)?;
        let size = content.len() as u64;
        if size > self.limits.max_file_bytes {
            return Err(SourceError::FileTooLarge { file: file.to_owned(), size, limit: self.limits.max_file_bytes });
        }
        Ok(content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::{Signature, TreeBuilder};
    use std::collections::BTreeMap;
    use tempfile::TempDir;

    /// What a test puts at a path of a commit.
    #[derive(Clone, Copy)]
    enum Entry<'a> {
        File(&'a str),
        Link(&'a str),
        Submodule,
    }
    use Entry::{File, Link, Submodule};

    /// A bare repository whose branch `main` has one commit holding `entries`.
    fn bare_repo(entries: &[(&str, Entry)]) -> (TempDir, PathBuf) {
        let tmp = TempDir::new().unwrap();
        let path = tmp.path().join("demo.git");
        let repo = Repository::init_bare(&path).unwrap();
        let sig = Signature::now("t", "t@example.com").unwrap();
        // A commit for submodule entries to point at.
        let empty = repo.treebuilder(None).unwrap().write().unwrap();
        let empty = repo.find_tree(empty).unwrap();
        let gitlink = repo.commit(None, &sig, &sig, "sub", &empty, &[]).unwrap();

        #[derive(Default)]
        struct Dir {
            entries: BTreeMap<String, (Oid, i32)>,
            dirs: BTreeMap<String, Dir>,
        }
        fn write(repo: &Repository, dir: &Dir) -> Oid {
            let mut builder: TreeBuilder = repo.treebuilder(None).unwrap();
            for (name, (oid, mode)) in &dir.entries {
                builder.insert(name, *oid, *mode).unwrap();
            }
            for (name, sub) in &dir.dirs {
                builder.insert(name, write(repo, sub), MODE_TREE).unwrap();
            }
            builder.write().unwrap()
        }
        let mut root = Dir::default();
        for (path, entry) in entries {
            let (oid, mode) = match entry {
                File(content) => (repo.blob(content.as_bytes()).unwrap(), MODE_BLOB),
                Link(target) => (repo.blob(target.as_bytes()).unwrap(), MODE_SYMLINK),
                Submodule => (gitlink, 0o160000),
            };
            let mut parts: Vec<_> = path.split('/').collect();
            let name = parts.pop().unwrap();
            let dir = parts.into_iter().fold(&mut root, |d, p| d.dirs.entry(p.to_owned()).or_default());
            dir.entries.insert(name.to_owned(), (oid, mode));
        }
        let tree = repo.find_tree(write(&repo, &root)).unwrap();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "Deploy web\n\nTwo replicas.", &tree, &[]).unwrap();
        (tmp, path)
    }

    fn paths(files: &[ManifestFile]) -> Vec<(&str, &str)> {
        files.iter().map(|f| (f.path.as_str(), std::str::from_utf8(&f.content).unwrap())).collect()
    }

    fn read(path: &Path, dir: &str) -> Result<Commit, String> {
        read_commit(path, "main", dir, &Limits::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn t10_reads_yaml_under_a_directory_in_path_order() {
        let (_tmp, repo) = bare_repo(&[
            ("README.md", File("# hi")),
            ("deploy/web/service.yml", File("s")),
            ("deploy/web/deploy.yaml", File("d")),
            ("deploy/a.yaml", File("a")),
            ("deploy/notes.txt", File("n")),
            ("deploy/yaml", File("no extension")),
            ("deploy/vendor", Submodule),
            ("deploy/sub.yaml", Submodule),
            ("other/x.yaml", File("x")),
        ]);
        let commit = read(&repo, "deploy").unwrap();
        assert_eq!(commit.id.len(), 40);
        assert_eq!(commit.subject, "Deploy web");
        assert_eq!(
            paths(&commit.files),
            [("deploy/a.yaml", "a"), ("deploy/web/deploy.yaml", "d"), ("deploy/web/service.yml", "s")]
        );
        for dir in ["/deploy/", "./deploy", "deploy//"] {
            assert_eq!(read(&repo, dir).unwrap().files, commit.files, "{dir}");
        }
        let all = read(&repo, "").unwrap();
        assert_eq!(all.files.len(), 4);
        assert_eq!(all.files.last().unwrap().path, "other/x.yaml");
    }

    #[test]
    fn t10_repository_branch_and_directory_errors() {
        let (tmp, repo) = bare_repo(&[("deploy/a.yaml", File("a")), ("file", File("f"))]);
        let cases = [
            (
                repo.clone(),
                "dev",
                "",
                "repository demo.git has no branch dev: push one with git push <url> dev".to_owned(),
            ),
            (repo.clone(), "a..b", "", "\"a..b\" is not a valid branch name: use a name like main".into()),
            (repo.clone(), "ma\0in", "", "\"ma\\0in\" is not a valid branch name: use a name like main".into()),
            (
                repo.clone(),
                "main",
                "prod",
                format!(
                    "commit {} of demo.git has no directory prod: create it, or fix the path",
                    &read(&repo, "").unwrap().id[..12]
                ),
            ),
            (
                repo.clone(),
                "main",
                "file",
                format!(
                    "file in commit {} of demo.git is not a directory: point the path at a directory",
                    &read(&repo, "").unwrap().id[..12]
                ),
            ),
            (
                repo.clone(),
                "main",
                "../x",
                "\"../x\" is not a valid directory: use a path inside the repository, without .. (empty for the root)"
                    .into(),
            ),
        ];
        for (path, branch, dir, expected) in cases {
            let e = read_commit(&path, branch, dir, &Limits::default()).unwrap_err();
            assert_eq!(e.to_string(), expected);
        }
        let missing = tmp.path().join("nope.git");
        let e = read_commit(&missing, "main", "", &Limits::default()).unwrap_err();
        assert!(matches!(e, SourceError::RepositoryNotFound { .. }), "{e:?}");
        assert!(e.to_string().contains("create one with git init --bare"), "{e}");

        // An empty repository has no branch yet: the first push makes it.
        let empty = tmp.path().join("empty.git");
        Repository::init_bare(&empty).unwrap();
        let e = read_commit(&empty, "main", "", &Limits::default()).unwrap_err();
        assert_eq!(e.to_string(), "repository empty.git has no branch main: push one with git push <url> main");
    }

    #[test]
    fn t10_limits_are_checked_before_reading() {
        let big = "x".repeat(2048);
        let (_tmp, repo) = bare_repo(&[("a.yaml", File("small")), ("b.yaml", File(&big)), ("c.yaml", File("c"))]);
        let limits = Limits { max_file_bytes: 1024, ..Limits::default() };
        let e = read_commit(&repo, "main", "", &limits).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.yaml is 2 KiB, over the limit of 1 KiB per manifest file: split it into smaller files"
        );

        let limits = Limits { max_total_bytes: 2050, ..Limits::default() };
        let e = read_commit(&repo, "main", "", &limits).unwrap_err();
        assert_eq!(e.to_string(), "the manifests add up to more than 2 KiB at b.yaml: split them across Applications");

        let limits = Limits { max_documents: 2, ..Limits::default() };
        let e = read_commit(&repo, "main", "", &limits).unwrap_err();
        assert_eq!(e.to_string(), "more than 2 manifest files in the repository root: split them across Applications");
    }

    #[test]
    fn t10_repeated_subtrees_cannot_make_the_walk_explode() {
        let (_tmp, path) = bare_repo(&[("a.yaml", File("a"))]);
        let repo = Repository::open_bare(&path).unwrap();
        // 10^6 paths from 7 small trees: each level names the one below ten times.
        let mut builder = repo.treebuilder(None).unwrap();
        builder.insert("notes.txt", repo.blob(b"n").unwrap(), MODE_BLOB).unwrap();
        let mut tree = builder.write().unwrap();
        for _ in 0..6 {
            let mut builder = repo.treebuilder(None).unwrap();
            for i in 0..10 {
                builder.insert(format!("d{i}"), tree, MODE_TREE).unwrap();
            }
            tree = builder.write().unwrap();
        }
        let sig = Signature::now("t", "t@example.com").unwrap();
        let parent = repo.find_reference("refs/heads/main").unwrap().peel_to_commit().unwrap();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "bomb", &repo.find_tree(tree).unwrap(), &[&parent]).unwrap();
        let limits = Limits { max_tree_entries: 1000, ..Limits::default() };
        let e = read_commit(&path, "main", "", &limits).unwrap_err();
        assert_eq!(
            e.to_string(),
            "more than 1000 files and directories in the repository root: point the path at the directory of the manifests"
        );
    }

    #[test]
    fn t10_symlinks_stay_inside_the_directory() {
        let (_tmp, repo) = bare_repo(&[
            ("deploy/base/cm.yaml", File("cm")),
            ("deploy/link.yaml", Link("base/cm.yaml")),
            ("deploy/chain.yaml", Link("./link.yaml")),
            ("deploy/base/up.yml", Link("../base/cm.yaml")),
            ("deploy/dir-link", Link("base")),
            ("secret.yaml", File("s")),
        ]);
        let commit = read(&repo, "deploy").unwrap();
        assert_eq!(
            paths(&commit.files),
            [
                ("deploy/base/cm.yaml", "cm"),
                ("deploy/base/up.yml", "cm"),
                ("deploy/chain.yaml", "cm"),
                ("deploy/link.yaml", "cm")
            ]
        );

        let cases = [
            (
                Link("../secret.yaml"),
                "deploy/x.yaml is a symlink to ../secret.yaml, which is outside deploy: point it inside, or copy the file",
            ),
            (
                Link("../../../etc/passwd.yaml"),
                "deploy/x.yaml is a symlink to ../../../etc/passwd.yaml, which is outside deploy: point it inside, or copy the file",
            ),
            (
                Link("/etc/passwd"),
                "deploy/x.yaml is a symlink to the absolute path /etc/passwd: use a relative target inside deploy",
            ),
            (
                Link("missing.yaml"),
                "deploy/x.yaml is a symlink to missing.yaml, which does not exist: fix or remove the link",
            ),
            (Link("base"), "deploy/x.yaml is a symlink to base, which is not a regular file: link to a manifest file"),
            (Link("x.yaml"), "deploy/x.yaml is a symlink through more than 8 links: point it at the file directly"),
        ];
        for (entry, expected) in cases {
            let (_tmp, repo) =
                bare_repo(&[("deploy/base/cm.yaml", File("cm")), ("secret.yaml", File("s")), ("deploy/x.yaml", entry)]);
            assert_eq!(read(&repo, "deploy").unwrap_err(), expected);
        }
    }

    #[test]
    fn t10_reads_a_plain_directory_by_the_same_rules() {
        let tmp = TempDir::new().unwrap();
        let root = tmp.path().join("repo");
        let write = |path: &str, content: &str| {
            let path = root.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        };
        write("web/deploy.yaml", "d");
        write("a.yml", "a");
        write("notes.txt", "n");
        write(".git/config.yaml", "not a manifest");
        fs::write(tmp.path().join("outside.yaml"), "o").unwrap();
        std::os::unix::fs::symlink("web/deploy.yaml", root.join("link.yaml")).unwrap();
        std::os::unix::fs::symlink("web", root.join("web-link")).unwrap();
        let files = read_dir(&root, &Limits::default()).unwrap();
        assert_eq!(paths(&files), [("a.yml", "a"), ("link.yaml", "d"), ("web/deploy.yaml", "d")]);

        let shown = root.display().to_string();
        let cases = [
            (
                "../outside.yaml",
                format!(
                    "x.yaml is a symlink to ../outside.yaml, which is outside {shown}: point it inside, or copy the file"
                ),
            ),
            (
                "web-link/../../outside.yaml",
                format!(
                    "x.yaml is a symlink to web-link/../../outside.yaml, which is outside {shown}: point it inside, or copy the file"
                ),
            ),
            (
                "/etc/hostname",
                format!("x.yaml is a symlink to the absolute path /etc/hostname: use a relative target inside {shown}"),
            ),
            ("nope.yaml", "x.yaml is a symlink to nope.yaml, which does not exist: fix or remove the link".into()),
        ];
        for (target, expected) in cases {
            std::os::unix::fs::symlink(target, root.join("x.yaml")).unwrap();
            let e = read_dir(&root, &Limits::default()).unwrap_err();
            assert_eq!(e.to_string(), expected);
            fs::remove_file(root.join("x.yaml")).unwrap();
        }
        // A symlinked directory on the way out is caught by the real path.
        std::os::unix::fs::symlink(tmp.path(), root.join("up")).unwrap();
        std::os::unix::fs::symlink("up/outside.yaml", root.join("x.yaml")).unwrap();
        let e = read_dir(&root, &Limits::default()).unwrap_err();
        assert!(matches!(e, SourceError::SymlinkEscapes { .. }), "{e}");

        let limits = Limits { max_file_bytes: 0, ..Limits::default() };
        let e = read_dir(&root.join("web"), &limits).unwrap_err();
        assert_eq!(
            e.to_string(),
            "deploy.yaml is 1 byte, over the limit of 0 bytes per manifest file: split it into smaller files"
        );
        let e = read_dir(&root.join("a.yml"), &Limits::default()).unwrap_err();
        assert!(matches!(e, SourceError::NotADirectoryOnDisk { .. }), "{e}");
    }

    #[test]
    fn t10_link_resolution() {
        let cases = [
            ("a.yaml", "b.yaml", Some("b.yaml")),
            ("d/a.yaml", "../b.yaml", Some("b.yaml")),
            ("d/a.yaml", "./e//f.yaml", Some("d/e/f.yaml")),
            ("d/a.yaml", "../../b.yaml", None),
            ("a.yaml", "..", None),
        ];
        for (link, target, expected) in cases {
            assert_eq!(resolve_link(link, target).as_deref(), expected, "{link} -> {target}");
        }
        assert!(inside("deploy", "deploy/a.yaml"));
        assert!(!inside("deploy", "deployments/a.yaml"));
        assert!(!inside("deploy", "deploy"));
        assert!(inside("", "a.yaml"));
    }
}
