use super::*;

fn spec() -> BatchSpec {
    BatchSpec {
        size: 3,
        body: None,
        results: "/results".into(),
        status: None,
        weight: Default::default(),
    }
}

#[test]
fn placeholder() {
    assert!(pair(&spec(), 200, "[]", 0).unwrap().is_empty());
}
