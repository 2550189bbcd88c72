//! `schemas/` is generated from the Rust types; this fails when it is stale.
//! Regenerate with `cargo run --bin gitplane -- schemas write`.

use std::{collections::BTreeSet, path::Path};

#[test]
fn checked_in_schemas_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    let generated = gitplane_api::kinds::schema_files();
    for (name, text) in &generated {
        let on_disk = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            on_disk == *text,
            "schemas/{name} differs from what the types generate: run `cargo run --bin gitplane -- schemas write`"
        );
    }
    let expected: BTreeSet<String> = generated.into_iter().map(|(name, _)| name).collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default();
    let stale: Vec<_> = present.iter().filter(|f| f.ends_with(".json") && !expected.contains(*f)).collect();
    assert!(stale.is_empty(), "schemas/ holds files no kind generates: {stale:?}");
}
