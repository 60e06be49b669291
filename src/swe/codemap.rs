//! Code maps with tree-sitter: definitions with qualified names and line spans, file skeletons,
//! repository tree views and numbered code windows (the views Agentless shows a model).
//!
//! Supported: Python, Rust, JavaScript, TypeScript/TSX, Java, Go. Qualified names join scopes with
//! `.` in every language: `func`, `Class`, `Class.method`, `Outer.Inner.method`, `outer.inner`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use tree_sitter::{Node, Parser};

/// A source language with a tree-sitter grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    /// `.py`, `.pyi`
    Python,
    /// `.rs`
    Rust,
    /// `.js`, `.jsx`, `.mjs`, `.cjs`
    JavaScript,
    /// `.ts`, `.mts`, `.cts`
    TypeScript,
    /// `.tsx`
    Tsx,
    /// `.java`
    Java,
    /// `.go`
    Go,
}

impl Lang {
    /// The language of a path, by extension.
    pub fn from_path(path: &str) -> Option<Lang> {
        let ext = path.rsplit_once('.').map(|(_, e)| e)?;
        Some(match ext {
            "py" | "pyi" => Lang::Python,
            "rs" => Lang::Rust,
            "js" | "jsx" | "mjs" | "cjs" => Lang::JavaScript,
            "ts" | "mts" | "cts" => Lang::TypeScript,
            "tsx" => Lang::Tsx,
            "java" => Lang::Java,
            "go" => Lang::Go,
            _ => return None,
        })
    }

    fn grammar(self) -> tree_sitter::Language {
        match self {
            Lang::Python => tree_sitter_python::LANGUAGE.into(),
            Lang::Rust => tree_sitter_rust::LANGUAGE.into(),
            Lang::JavaScript => tree_sitter_javascript::LANGUAGE.into(),
            Lang::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
            Lang::Tsx => tree_sitter_typescript::LANGUAGE_TSX.into(),
            Lang::Java => tree_sitter_java::LANGUAGE.into(),
            Lang::Go => tree_sitter_go::LANGUAGE.into(),
        }
    }
}

/// What a definition is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DefKind {
    /// A function (top level or nested in a function).
    Function,
    /// A class or class-like container (struct, enum, trait, impl, interface, module).
    Class,
    /// A function directly inside a class-like container.
    Method,
}

impl DefKind {
    /// The word used in answers: `function`, `class`, `method`.
    pub fn word(self) -> &'static str {
        match self {
            DefKind::Function => "function",
            DefKind::Class => "class",
            DefKind::Method => "method",
        }
    }
}

/// One definition found in a file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Definition {
    /// Qualified name (`Class.method`).
    pub name: String,
    /// Function, class or method.
    pub kind: DefKind,
    /// First line, 1-based, decorators/attributes included.
    pub start_line: usize,
    /// Last line, 1-based, inclusive.
    pub end_line: usize,
    /// Column of the definition keyword (its indentation).
    pub indent: usize,
    /// Defined inside a function body (not a localization unit of its own).
    pub in_function: bool,
}

impl Definition {
    /// Whether `line` (1-based) lies in the definition.
    pub fn contains(&self, line: usize) -> bool {
        self.start_line <= line && line <= self.end_line
    }
}

thread_local! {
    static PARSERS: RefCell<HashMap<Lang, Parser>> = RefCell::new(HashMap::new());
}

fn parse(lang: Lang, source: &str) -> Option<tree_sitter::Tree> {
    PARSERS.with(|cell| {
        let mut map = cell.borrow_mut();
        let parser = match map.entry(lang) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut p = Parser::new();
                p.set_language(&lang.grammar()).ok()?;
                v.insert(p)
            }
        };
        parser.parse(source, None)
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Func,
    Container,
}

fn text<'a>(node: Node<'_>, src: &'a str) -> &'a str {
    src.get(node.byte_range()).unwrap_or("")
}

fn field_text<'a>(node: Node<'_>, field: &str, src: &'a str) -> Option<&'a str> {
    node.child_by_field_name(field).map(|n| text(n, src))
}

/// Strips generic arguments and pointers from a type name: `*Foo[T]` / `Foo<T>` -> `Foo`.
fn bare_type(t: &str) -> String {
    let t = t.trim().trim_start_matches(['*', '&']).trim();
    let end = t.find(['<', '[', '(', ' ']).unwrap_or(t.len());
    t[..end].to_string()
}

/// Classifies a node as a definition: its shape, name and an explicit scope prefix (Go methods).
fn classify(lang: Lang, node: Node<'_>, src: &str) -> Option<(Shape, String, Option<String>)> {
    let k = node.kind();
    let name = |f: &str| field_text(node, f, src).map(|s| s.to_string());
    let r = match lang {
        Lang::Python => match k {
            "function_definition" => (Shape::Func, name("name")?, None),
            "class_definition" => (Shape::Container, name("name")?, None),
            _ => return None,
        },
        Lang::Rust => match k {
            "function_item" | "function_signature_item" => (Shape::Func, name("name")?, None),
            "struct_item" | "enum_item" | "union_item" | "trait_item" | "mod_item" => {
                (Shape::Container, name("name")?, None)
            }
            "impl_item" => (Shape::Container, bare_type(&name("type")?), None),
            _ => return None,
        },
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => match k {
            "function_declaration" | "generator_function_declaration" => {
                (Shape::Func, name("name")?, None)
            }
            "method_definition" => (Shape::Func, name("name")?, None),
            "class_declaration" | "abstract_class_declaration" | "interface_declaration" => {
                (Shape::Container, name("name")?, None)
            }
            "variable_declarator" => {
                let v = node.child_by_field_name("value")?;
                if matches!(
                    v.kind(),
                    "arrow_function" | "function_expression" | "function" | "generator_function"
                ) {
                    (Shape::Func, name("name")?, None)
                } else if v.kind() == "class" {
                    (Shape::Container, name("name")?, None)
                } else {
                    return None;
                }
            }
            _ => return None,
        },
        Lang::Java => match k {
            "method_declaration" | "constructor_declaration" => (Shape::Func, name("name")?, None),
            "class_declaration"
            | "interface_declaration"
            | "enum_declaration"
            | "record_declaration"
            | "annotation_type_declaration" => (Shape::Container, name("name")?, None),
            _ => return None,
        },
        Lang::Go => match k {
            "function_declaration" => (Shape::Func, name("name")?, None),
            "method_declaration" => {
                let recv = node.child_by_field_name("receiver")?;
                let mut ty = None;
                let mut c = recv.walk();
                for p in recv.named_children(&mut c) {
                    if let Some(t) = p.child_by_field_name("type") {
                        ty = Some(bare_type(text(t, src)));
                    }
                }
                (Shape::Func, name("name")?, ty)
            }
            "type_spec" => {
                let t = node.child_by_field_name("type")?;
                if matches!(t.kind(), "struct_type" | "interface_type") {
                    (Shape::Container, name("name")?, None)
                } else {
                    return None;
                }
            }
            _ => return None,
        },
    };
    Some(r)
}

/// Start row including Python decorators and Rust attributes.
fn start_row(lang: Lang, node: Node<'_>) -> usize {
    match lang {
        Lang::Python => match node.parent() {
            Some(p) if p.kind() == "decorated_definition" => p.start_position().row,
            _ => node.start_position().row,
        },
        Lang::Rust => {
            let mut row = node.start_position().row;
            let mut prev = node.prev_sibling();
            while let Some(p) = prev {
                if p.kind() != "attribute_item" || p.end_position().row + 1 < row {
                    break;
                }
                row = p.start_position().row;
                prev = p.prev_sibling();
            }
            row
        }
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => {
            // `export function f` / `const f = () => ...`: the statement holds the line.
            let mut n = node;
            while let Some(p) = n.parent() {
                if matches!(
                    p.kind(),
                    "export_statement" | "lexical_declaration" | "variable_declaration"
                ) {
                    n = p;
                } else {
                    break;
                }
            }
            n.start_position().row
        }
        _ => node.start_position().row,
    }
}

fn end_row(lang: Lang, node: Node<'_>) -> usize {
    let mut n = node;
    if matches!(lang, Lang::JavaScript | Lang::TypeScript | Lang::Tsx) {
        while let Some(p) = n.parent() {
            if matches!(p.kind(), "lexical_declaration" | "variable_declaration") {
                n = p;
            } else {
                break;
            }
        }
    }
    let end = n.end_position();
    // A node ending at column 0 ends on the previous line.
    if end.column == 0 && end.row > n.start_position().row {
        end.row - 1
    } else {
        end.row
    }
}

struct Walker<'s> {
    lang: Lang,
    src: &'s str,
    out: Vec<Definition>,
}

impl Walker<'_> {
    fn visit(&mut self, node: Node<'_>, scope: &mut Vec<(String, Shape)>) {
        let def = classify(self.lang, node, self.src);
        let pushed = if let Some((shape, name, prefix)) = def {
            let parent_shape = scope.last().map(|s| s.1);
            let in_function = scope.iter().any(|s| s.1 == Shape::Func);
            let kind = match shape {
                Shape::Container => DefKind::Class,
                Shape::Func if prefix.is_some() || parent_shape == Some(Shape::Container) => {
                    DefKind::Method
                }
                Shape::Func => DefKind::Function,
            };
            let mut parts: Vec<&str> = scope.iter().map(|s| s.0.as_str()).collect();
            if let Some(p) = &prefix {
                parts.push(p);
            }
            parts.push(&name);
            let qualified = parts.join(".");
            self.out.push(Definition {
                name: qualified,
                kind,
                start_line: start_row(self.lang, node) + 1,
                end_line: end_row(self.lang, node) + 1,
                indent: node.start_position().column,
                in_function,
            });
            scope.push((name, shape));
            true
        } else {
            false
        };
        let mut c = node.walk();
        for child in node.named_children(&mut c) {
            self.visit(child, scope);
        }
        if pushed {
            scope.pop();
        }
    }
}

/// All definitions of a file, in source order. Empty when the source does not parse at all.
pub fn definitions(lang: Lang, source: &str) -> Vec<Definition> {
    let Some(tree) = parse(lang, source) else {
        return Vec::new();
    };
    let mut w = Walker {
        lang,
        src: source,
        out: Vec::new(),
    };
    w.visit(tree.root_node(), &mut Vec::new());
    // Rust `impl Foo` blocks share the struct's name: keep the first definition of each name for units,
    // but all spans stay listed (lookups take the innermost containing span).
    w.out
}

/// The localization units of a file: definitions not nested inside a function.
pub fn units(defs: &[Definition]) -> impl Iterator<Item = &Definition> {
    defs.iter().filter(|d| !d.in_function)
}

/// The innermost localization unit containing `line` (1-based), if any.
pub fn unit_at(defs: &[Definition], line: usize) -> Option<&Definition> {
    units(defs)
        .filter(|d| d.contains(line))
        .min_by_key(|d| (d.end_line - d.start_line, std::cmp::Reverse(d.start_line)))
}

/// Longest kept assignment line in skeletons before it is cut.
const MAX_ASSIGN_CHARS: usize = 100;

fn shorten(first_line: &str, multi: bool) -> String {
    let mut s: String = first_line.trim_end().to_string();
    let mut cut = false;
    if s.chars().count() > MAX_ASSIGN_CHARS {
        s = s.chars().take(MAX_ASSIGN_CHARS).collect();
        cut = true;
    }
    if cut || multi {
        s.push_str(" ...");
    }
    s
}

struct Skel<'s> {
    lang: Lang,
    src: &'s str,
    lines: Vec<&'s str>,
    out: Vec<String>,
}

impl Skel<'_> {
    fn line(&self, row: usize) -> &str {
        self.lines
            .get(row)
            .copied()
            .unwrap_or("")
            .trim_end_matches(['\n', '\r'])
    }

    /// Header of a definition: from its (decorated) start to where its body begins.
    fn header(&mut self, outer: Node<'_>, body: Option<Node<'_>>) {
        let start = outer.start_position().row;
        match body {
            Some(b) if b.start_position().row > start => {
                for r in start..b.start_position().row {
                    let l = self.line(r).to_string();
                    self.out.push(l);
                }
                // The body's first line may hold the opening brace (`) {` of a multi-line signature).
                let bl = self.line(b.start_position().row);
                let col = b.start_position().column.min(bl.len());
                let before = bl.get(..col).unwrap_or("");
                if !before.trim().is_empty() {
                    self.out.push(before.trim_end().to_string());
                }
            }
            Some(b) => {
                let l = self.line(start);
                let col = b.start_position().column.min(l.len());
                let mut h = l.get(..col).unwrap_or(l).trim_end().to_string();
                if self.lang != Lang::Python && h.ends_with('{') {
                    h.pop();
                    h = h.trim_end().to_string();
                }
                self.out.push(h);
            }
            None => {
                let end = end_row(self.lang, outer);
                for r in start..=end.min(start + 3) {
                    let l = self.line(r).to_string();
                    self.out.push(l);
                }
            }
        }
    }

    fn indent_of(&self, row: usize) -> String {
        self.line(row)
            .chars()
            .take_while(|c| c.is_whitespace())
            .collect()
    }

    fn python_block(&mut self, block: Node<'_>, in_class: bool) {
        let mut c = block.walk();
        let children: Vec<Node<'_>> = block.named_children(&mut c).collect();
        for child in children {
            let def = if child.kind() == "decorated_definition" {
                child.child_by_field_name("definition")
            } else {
                Some(child)
            };
            match def.map(|d| d.kind()) {
                Some("function_definition") | Some("class_definition") => {
                    let Some(d) = def else { continue };
                    let body = d.child_by_field_name("body");
                    self.header(child, body);
                    let ind = format!("{}    ", self.indent_of(d.start_position().row));
                    if d.kind() == "class_definition" {
                        let before = self.out.len();
                        if let Some(b) = body {
                            self.python_block(b, true);
                        }
                        if self.out.len() == before {
                            self.out.push(format!("{ind}..."));
                        }
                    } else {
                        self.out.push(format!("{ind}..."));
                    }
                }
                Some("expression_statement") => {
                    let is_assign = child
                        .named_child(0)
                        .is_some_and(|n| matches!(n.kind(), "assignment" | "augmented_assignment"));
                    let is_doc = child.named_child(0).is_some_and(|n| n.kind() == "string");
                    if is_assign || (is_doc && !in_class && false) {
                        let r0 = child.start_position().row;
                        let multi = end_row(self.lang, child) > r0;
                        let l = shorten(self.line(r0), multi);
                        self.out.push(l);
                    }
                }
                _ => {}
            }
        }
    }

    fn generic(&mut self, node: Node<'_>, depth: usize) {
        let mut c = node.walk();
        let children: Vec<Node<'_>> = node.named_children(&mut c).collect();
        for child in children {
            let def = classify(self.lang, child, self.src);
            match def {
                Some((shape, _, _)) => {
                    // For JS `const f = () => {}` the body sits in the value.
                    let holder = if child.kind() == "variable_declarator" {
                        child.child_by_field_name("value").unwrap_or(child)
                    } else {
                        child
                    };
                    let body = holder
                        .child_by_field_name("body")
                        .or_else(|| {
                            if child.kind() == "type_spec" {
                                None
                            } else {
                                holder.child_by_field_name("type")
                            }
                        })
                        .filter(|b| b.kind() != "type_identifier");
                    let outer = outer_statement(self.lang, child);
                    match (shape, body) {
                        (Shape::Func, Some(b)) => {
                            self.header(outer, Some(b));
                            if let Some(last) = self.out.last_mut() {
                                last.push_str(" { ... }");
                            }
                        }
                        (Shape::Container, Some(b)) if child.kind() != "type_spec" => {
                            self.header(outer, Some(b));
                            if let Some(last) = self.out.last_mut() {
                                if !last.trim_end().ends_with('{') {
                                    last.push_str(" {");
                                }
                            }
                            let before = self.out.len();
                            self.generic(b, depth + 1);
                            let ind = self.indent_of(outer.start_position().row);
                            if self.out.len() == before {
                                if let Some(last) = self.out.last_mut() {
                                    last.push_str(" ... }");
                                }
                            } else {
                                self.out.push(format!("{ind}}}"));
                            }
                        }
                        _ => {
                            let r0 = outer.start_position().row;
                            let r1 = end_row(self.lang, outer);
                            if r1 - r0 <= 12 {
                                for r in r0..=r1 {
                                    let l = self.line(r).to_string();
                                    self.out.push(l);
                                }
                            } else {
                                let l = shorten(self.line(r0), true);
                                self.out.push(l);
                            }
                        }
                    }
                }
                None => {
                    let k = child.kind();
                    let keep_short = matches!(
                        k,
                        "const_item"
                            | "static_item"
                            | "const_declaration"
                            | "var_declaration"
                            | "field_declaration"
                            | "lexical_declaration"
                            | "variable_declaration"
                            | "public_field_definition"
                    ) && !has_function_value(child);
                    if keep_short && !(self.lang == Lang::Rust && k == "field_declaration") {
                        let r0 = child.start_position().row;
                        let multi = end_row(self.lang, child) > r0;
                        let l = shorten(self.line(r0), multi);
                        self.out.push(l);
                    } else if !keep_short && descend_into(self.lang, k) {
                        self.generic(child, depth);
                    }
                }
            }
        }
    }
}

fn has_function_value(node: Node<'_>) -> bool {
    let mut c = node.walk();
    let kids: Vec<Node<'_>> = node.named_children(&mut c).collect();
    kids.iter().any(|d| {
        d.kind() == "variable_declarator"
            && d.child_by_field_name("value").is_some_and(|v| {
                matches!(
                    v.kind(),
                    "arrow_function" | "function_expression" | "function" | "class"
                )
            })
    })
}

/// Statement wrappers a skeleton looks through for definitions.
fn descend_into(lang: Lang, kind: &str) -> bool {
    match lang {
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => matches!(
            kind,
            "export_statement" | "lexical_declaration" | "variable_declaration"
        ),
        Lang::Go => matches!(kind, "type_declaration"),
        Lang::Java => matches!(kind, "program"),
        _ => false,
    }
}

fn outer_statement(lang: Lang, node: Node<'_>) -> Node<'_> {
    let mut n = node;
    if matches!(lang, Lang::JavaScript | Lang::TypeScript | Lang::Tsx) {
        while let Some(p) = n.parent() {
            if matches!(
                p.kind(),
                "export_statement" | "lexical_declaration" | "variable_declaration"
            ) {
                n = p;
            } else {
                break;
            }
        }
    }
    if lang == Lang::Go && node.kind() == "type_spec" {
        if let Some(p) = node.parent() {
            if p.kind() == "type_declaration" {
                return p;
            }
        }
    }
    n
}

/// The skeleton of a file: definitions with signatures and decorators, bodies as `...`, module-level
/// (and class-level) assignments with long ones shortened. Empty when the source does not parse.
pub fn skeleton(lang: Lang, source: &str) -> String {
    let Some(tree) = parse(lang, source) else {
        return String::new();
    };
    let mut s = Skel {
        lang,
        src: source,
        lines: source.split_inclusive('\n').collect(),
        out: Vec::new(),
    };
    if lang == Lang::Python {
        s.python_block(tree.root_node(), false);
    } else {
        s.generic(tree.root_node(), 0);
    }
    let mut text = s.out.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    text
}

/// Folder names whose content is vendored third-party code.
const VENDORED: [&str; 7] = [
    "vendor",
    "vendored",
    "_vendor",
    "third_party",
    "thirdparty",
    "node_modules",
    "externals",
];

/// Whether a path lies in a test folder or is a test file (`test_x.py`, `x_test.go`, `conftest.py`...).
pub fn is_test_path(path: &str) -> bool {
    let mut parts = path.split('/').peekable();
    while let Some(p) = parts.next() {
        let last = parts.peek().is_none();
        let lower = p.to_ascii_lowercase();
        if !last && matches!(lower.as_str(), "tests" | "test" | "testing" | "__tests__") {
            return true;
        }
        if last {
            let stem = lower.split('.').next().unwrap_or("");
            return stem.starts_with("test_")
                || stem.ends_with("_test")
                || stem.ends_with("_tests")
                || lower == "conftest.py"
                || lower.contains(".test.")
                || lower.contains(".spec.")
                || (stem == "tests" && lower.ends_with(".rs"));
        }
    }
    false
}

/// Whether a path lies in a vendored folder.
pub fn is_vendored_path(path: &str) -> bool {
    path.split('/')
        .rev()
        .skip(1)
        .any(|p| VENDORED.contains(&p.to_ascii_lowercase().as_str()))
}

/// Whether a path is a source file the views show.
pub fn is_source_path(path: &str) -> bool {
    Lang::from_path(path).is_some()
        || matches!(
            path.rsplit_once('.').map(|(_, e)| e),
            Some("c" | "h" | "cc" | "cpp" | "hpp" | "rb" | "php" | "kt" | "scala" | "swift")
        )
}

/// A repository tree view and the files it lists.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TreeView {
    /// Indented listing; test and vendored folders are shown collapsed with a marker.
    pub text: String,
    /// Files listed by path (the ones an answer may name).
    pub files: Vec<String>,
}

#[derive(Default)]
struct Dir {
    dirs: BTreeMap<String, Dir>,
    files: Vec<String>,
    count: usize,
}

/// The repository tree of source files, Agentless style: folders end in `/`, entries indented by 4
/// spaces; test and vendored folders are collapsed to one marked line; test files are marked.
pub fn tree_view<'a>(root_name: &str, paths: impl IntoIterator<Item = &'a str>) -> TreeView {
    let mut root = Dir::default();
    for p in paths.into_iter().filter(|p| is_source_path(p)) {
        let parts: Vec<&str> = p.split('/').collect();
        let mut d = &mut root;
        d.count += 1;
        for part in &parts[..parts.len() - 1] {
            d = d.dirs.entry((*part).to_string()).or_default();
            d.count += 1;
        }
        d.files.push(p.to_string());
    }
    let mut text = format!("{root_name}/\n");
    let mut files = Vec::new();
    fn walk(d: &Dir, depth: usize, prefix: &str, text: &mut String, files: &mut Vec<String>) {
        let pad = "    ".repeat(depth);
        for (name, sub) in &d.dirs {
            let lower = name.to_ascii_lowercase();
            let path = format!("{prefix}{name}/");
            if matches!(lower.as_str(), "tests" | "test" | "testing" | "__tests__") {
                text.push_str(&format!(
                    "{pad}{name}/  [test folder, {} files]\n",
                    sub.count
                ));
            } else if VENDORED.contains(&lower.as_str()) {
                text.push_str(&format!("{pad}{name}/  [vendored, {} files]\n", sub.count));
            } else {
                text.push_str(&format!("{pad}{name}/\n"));
                walk(sub, depth + 1, &path, text, files);
            }
        }
        for f in &d.files {
            let name = f.rsplit('/').next().unwrap_or(f);
            if is_test_path(f) {
                text.push_str(&format!("{pad}{name}  [test]\n"));
            } else {
                text.push_str(&format!("{pad}{name}\n"));
            }
            files.push(f.clone());
        }
    }
    walk(&root, 1, "", &mut text, &mut files);
    TreeView { text, files }
}

/// Lines `start..=end` (1-based, clamped) of `source`, each prefixed by its number (`"  12| code"`).
pub fn code_window(source: &str, start: usize, end: usize) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let start = start.max(1);
    let end = end.min(lines.len());
    let width = end.to_string().len().max(3);
    let mut s = String::new();
    for n in start..=end {
        s.push_str(&format!("{n:>width$}| {}\n", lines[n - 1]));
    }
    s
}

/// Lines `start..=end` (1-based, clamped) of `source` verbatim, line endings kept.
pub fn raw_window(source: &str, start: usize, end: usize) -> String {
    source
        .split_inclusive('\n')
        .enumerate()
        .filter(|(i, _)| *i + 1 >= start && *i < end)
        .map(|(_, l)| l)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PY: &str = r#"import os

X = 1
BIG = {
    "a": 1,
}


@decorator
def top(a, b=2):
    """Doc."""
    def inner():
        return 1
    return inner() + a


class Outer(Base):
    attr = 3

    class Inner:
        def deep(self):
            pass

    @property
    async def run(self, x):
        return x
"#;

    #[test]
    fn python_definitions_and_skeleton() {
        let defs = definitions(Lang::Python, PY);
        let names: Vec<(&str, DefKind, usize, usize)> = defs
            .iter()
            .map(|d| (d.name.as_str(), d.kind, d.start_line, d.end_line))
            .collect();
        assert_eq!(
            names,
            vec![
                ("top", DefKind::Function, 9, 14),
                ("top.inner", DefKind::Function, 12, 13),
                ("Outer", DefKind::Class, 17, 26),
                ("Outer.Inner", DefKind::Class, 20, 22),
                ("Outer.Inner.deep", DefKind::Method, 21, 22),
                ("Outer.run", DefKind::Method, 24, 26),
            ]
        );
        assert!(defs[1].in_function);
        assert_eq!(unit_at(&defs, 13).unwrap().name, "top");
        assert_eq!(unit_at(&defs, 22).unwrap().name, "Outer.Inner.deep");
        assert_eq!(unit_at(&defs, 18).unwrap().name, "Outer");
        assert!(unit_at(&defs, 3).is_none());
        let sk = skeleton(Lang::Python, PY);
        assert_eq!(
            sk,
            "X = 1\nBIG = { ...\n@decorator\ndef top(a, b=2):\n    ...\nclass Outer(Base):\n    attr = 3\n    class Inner:\n        def deep(self):\n            ...\n    @property\n    async def run(self, x):\n        ...\n"
        );
    }

    #[test]
    fn tree_view_marks_tests_and_vendored() {
        let tv = tree_view(
            "repo",
            [
                "pkg/a.py",
                "pkg/tests/test_a.py",
                "pkg/_vendor/six.py",
                "README.md",
                "setup.py",
                "pkg/test_b.py",
            ],
        );
        assert_eq!(
            tv.text,
            "repo/\n    pkg/\n        _vendor/  [vendored, 1 files]\n        tests/  [test folder, 1 files]\n        a.py\n        test_b.py  [test]\n    setup.py\n"
        );
        assert_eq!(tv.files, vec!["pkg/a.py", "pkg/test_b.py", "setup.py"]);
    }
}
