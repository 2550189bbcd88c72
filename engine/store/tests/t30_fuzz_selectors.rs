//! Fuzzing the label selector parser (`?labelSelector=` of the status API, the store's lists):
//! any text is a selector or a clear error, never a panic, and a parsed selector matches any
//! object without panicking.

use gitplane_fuzz::{Target, fuzz};
use gitplane_store::selector::Selector;
use serde_json::json;

#[test]
fn t30_fuzz_label_selectors() {
    let seeds: [&[u8]; 5] = [
        b"app=web",
        b"app==web,tier!=db",
        b"env in (prod, staging),!legacy",
        b"team notin (a,b),version",
        b"example.com/role=edge,app.kubernetes.io/name=x",
    ];
    let dictionary: &[&[u8]] = &[
        b"=",
        b"==",
        b"!=",
        b"!",
        b",",
        b" in ",
        b" notin ",
        b"(",
        b")",
        b"/",
        b".",
        b"-",
        b"_",
        b" ",
        b"\\",
        b"\xe2\x80\x8b",
    ];
    let object =
        json!({"metadata": {"labels": {"app": "web", "tier": "db", "env": "prod", "example.com/role": "edge"}}});
    let runs = fuzz(Target { name: "selectors", seeds: &seeds, dictionary, max_len: 1024 }, |input| {
        let text = String::from_utf8_lossy(input);
        match Selector::parse(&text) {
            Ok(selector) => {
                selector.matches(&object);
                selector.matches(&json!({}));
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    });
    println!("selectors: {runs} inputs");
}
