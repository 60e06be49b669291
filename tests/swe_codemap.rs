//! Code maps for every supported language: qualified names, spans, skeletons.

use sorft::swe::codemap::{definitions, skeleton, unit_at, DefKind, Lang};

fn load(name: &str) -> (Lang, String) {
    let src = std::fs::read_to_string(format!("tests/fixtures/swe/{name}")).unwrap();
    (Lang::from_path(name).unwrap(), src)
}

fn names(name: &str) -> Vec<(String, DefKind, usize, usize)> {
    let (lang, src) = load(name);
    definitions(lang, &src)
        .into_iter()
        .map(|d| (d.name, d.kind, d.start_line, d.end_line))
        .collect()
}

fn has(v: &[(String, DefKind, usize, usize)], n: &str, k: DefKind, s: usize, e: usize) -> bool {
    v.iter()
        .any(|x| x.0 == n && x.1 == k && x.2 == s && x.3 == e)
}

#[test]
fn rust_impls_traits_attributes_and_nested_functions() {
    let v = names("sample.rs");
    assert!(has(&v, "Point", DefKind::Class, 5, 8), "{v:?}"); // #[derive] line included
    assert!(has(&v, "Point.new", DefKind::Method, 11, 13), "{v:?}");
    assert!(has(&v, "Shape.area", DefKind::Method, 21, 21), "{v:?}");
    assert!(has(&v, "helper.nested", DefKind::Function, 25, 27), "{v:?}");
    let (lang, src) = load("sample.rs");
    let defs = definitions(lang, &src);
    assert_eq!(unit_at(&defs, 26).unwrap().name, "helper");
    let sk = skeleton(lang, &src);
    assert!(sk.contains("const LIMIT: usize = 10;\n"), "{sk}");
    assert!(
        sk.contains("impl Point {\n    pub fn new(x: i32) -> Self { ... }\n"),
        "{sk}"
    );
    assert!(!sk.contains("abs()"), "{sk}");
}

#[test]
fn javascript_and_typescript() {
    let v = names("sample.js");
    assert!(has(&v, "compute", DefKind::Function, 5, 7), "{v:?}");
    assert!(has(&v, "arrow", DefKind::Function, 9, 11), "{v:?}");
    assert!(has(&v, "Cart.total", DefKind::Method, 18, 20), "{v:?}");
    let (lang, src) = load("sample.js");
    let sk = skeleton(lang, &src);
    assert!(sk.contains("const RATE = 3;"), "{sk}");
    assert!(sk.contains("  total() { ... }"), "{sk}");
    let v = names("sample.ts");
    assert!(has(&v, "Circle.area", DefKind::Method, 8, 10), "{v:?}");
    assert!(has(&v, "Shape", DefKind::Class, 1, 3), "{v:?}");
    assert!(has(&v, "double", DefKind::Function, 13, 13), "{v:?}");
}

#[test]
fn java_and_go() {
    let v = names("Sample.java");
    assert!(has(&v, "Sample.toString", DefKind::Method, 10, 13), "{v:?}");
    assert!(
        has(&v, "Sample.Inner.run", DefKind::Method, 16, 17),
        "{v:?}"
    );
    let (lang, src) = load("Sample.java");
    let sk = skeleton(lang, &src);
    assert!(
        sk.contains("    @Override\n    public String toString() { ... }"),
        "{sk}"
    );
    let v = names("sample.go");
    assert!(has(&v, "Server", DefKind::Class, 5, 7), "{v:?}");
    assert!(has(&v, "Server.Start", DefKind::Method, 9, 12), "{v:?}");
    assert!(has(&v, "Run", DefKind::Function, 14, 16), "{v:?}");
}

#[test]
fn broken_source_does_not_panic() {
    for lang in [
        Lang::Python,
        Lang::Rust,
        Lang::JavaScript,
        Lang::Tsx,
        Lang::Java,
        Lang::Go,
    ] {
        let src = "def (((\nclass {{ fn ) x\n\u{0}\u{7f}ü";
        let _ = definitions(lang, src);
        let _ = skeleton(lang, src);
    }
}
