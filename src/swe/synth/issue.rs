//! Issue text in a user's voice, written from a failing test: the call, expected versus actual, and
//! the traceback when the code raised. It never names the fix.
//!
//! Three styles ([`IssueStyle`]): `import` (a script that imports the module, so localization is one
//! pointer), `traceback` (only the traceback, whose frames name files, lines and functions; no
//! import line) and `behaviour` (the call, expected versus actual; no import line, no path).

use rand::seq::IndexedRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// How an issue points at the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueStyle {
    /// A reproduction script with `from {package} import {module}`.
    Import,
    /// A traceback only (frames name file, line, function); no import line.
    Traceback,
    /// What the user observed (call, expected versus actual); no import line, no path.
    Behaviour,
}

impl IssueStyle {
    /// The style's name (`import`, `traceback`, `behaviour`).
    pub fn name(self) -> &'static str {
        match self {
            IssueStyle::Import => "import",
            IssueStyle::Traceback => "traceback",
            IssueStyle::Behaviour => "behaviour",
        }
    }
}

/// Relative weights of the issue styles (`data.issue_styles`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IssueStyles {
    /// Weight of [`IssueStyle::Import`].
    pub import: f64,
    /// Weight of [`IssueStyle::Traceback`].
    pub traceback: f64,
    /// Weight of [`IssueStyle::Behaviour`].
    pub behaviour: f64,
}

impl Default for IssueStyles {
    /// Import only (the historical generator).
    fn default() -> Self {
        IssueStyles {
            import: 1.0,
            traceback: 0.0,
            behaviour: 0.0,
        }
    }
}

impl IssueStyles {
    /// The mix `sorft repro` uses: half the issues carry no import line.
    pub fn mixed() -> Self {
        IssueStyles {
            import: 0.5,
            traceback: 0.25,
            behaviour: 0.25,
        }
    }

    fn weights(&self) -> [(IssueStyle, f64); 3] {
        [
            (IssueStyle::Import, self.import),
            (IssueStyle::Traceback, self.traceback),
            (IssueStyle::Behaviour, self.behaviour),
        ]
    }

    /// Checks the weights: finite, non-negative, not all zero.
    pub fn check(&self) -> Result<(), String> {
        let w = self.weights();
        if let Some((s, x)) = w.iter().find(|(_, x)| !x.is_finite() || *x < 0.0) {
            return Err(format!(
                "issue_styles.{} = {x}: weights must be finite and >= 0",
                s.name()
            ));
        }
        if w.iter().map(|(_, x)| x).sum::<f64>() <= 0.0 {
            return Err("issue_styles: at least one weight must be positive".into());
        }
        Ok(())
    }

    /// Draws a style. A mix with a single positive weight draws nothing from `rng` (so the
    /// import-only default keeps the historical random stream).
    pub fn pick<R: Rng>(&self, rng: &mut R) -> IssueStyle {
        let w = self.weights();
        let live: Vec<&(IssueStyle, f64)> = w.iter().filter(|(_, x)| *x > 0.0).collect();
        if live.len() <= 1 {
            return live.first().map(|(s, _)| *s).unwrap_or(IssueStyle::Import);
        }
        let total: f64 = live.iter().map(|(_, x)| x).sum();
        let mut u = rng.random::<f64>() * total;
        for (s, x) in &live {
            if u < *x {
                return *s;
            }
            u -= x;
        }
        live.last().map(|(s, _)| *s).unwrap_or(IssueStyle::Import)
    }
}

/// Drops `module.` qualifiers of the project's modules from a code line (`mathutils.clamp(` ->
/// `clamp(`), so that a behaviour or traceback issue does not name the module.
pub fn strip_module_refs(line: &str, modules: &[String]) -> String {
    let mut out = line.to_string();
    for m in modules {
        let pat = format!("{m}.");
        let mut res = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(&pat) {
            let prev = rest[..i].chars().last();
            let word = prev.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.');
            res.push_str(&rest[..i]);
            if word {
                res.push_str(&pat);
            }
            rest = &rest[i + pat.len()..];
        }
        res.push_str(rest);
        out = res;
    }
    out
}

/// Splits a call's argument text at top-level commas.
pub fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut cur = String::new();
    let mut prev = ' ';
    for c in s.chars() {
        match quote {
            Some(q) => {
                if c == q && prev != '\\' {
                    quote = None;
                }
                cur.push(c);
            }
            None => match c {
                '"' | '\'' => {
                    quote = Some(c);
                    cur.push(c);
                }
                '(' | '[' | '{' => {
                    depth += 1;
                    cur.push(c);
                }
                ')' | ']' | '}' => {
                    depth -= 1;
                    cur.push(c);
                }
                ',' if depth == 0 => {
                    out.push(cur.trim().to_string());
                    cur.clear();
                }
                _ => cur.push(c),
            },
        }
        prev = c;
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The body lines of test method `name` in a test file, and the `setUp` body of its class.
pub fn test_body(test_src: &str, class: &str, name: &str) -> (Vec<String>, Vec<String>) {
    let lines: Vec<&str> = test_src.lines().collect();
    let mut in_class = false;
    let mut setup = Vec::new();
    let mut body = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.starts_with("class ") {
            in_class = l.starts_with(&format!("class {class}("));
        } else if in_class && l.starts_with("    def ") {
            let target = if l.starts_with(&format!("    def {name}(")) {
                Some(&mut body)
            } else if l.starts_with("    def setUp(") {
                Some(&mut setup)
            } else {
                None
            };
            if let Some(t) = target {
                let mut j = i + 1;
                while j < lines.len()
                    && (lines[j].starts_with("        ") || lines[j].trim().is_empty())
                {
                    if !lines[j].trim().is_empty() {
                        t.push(lines[j][8..].to_string());
                    }
                    j += 1;
                }
                i = j;
                continue;
            }
        }
        i += 1;
    }
    (setup, body)
}

/// Turns a unittest assertion line into a user's script line (`print(x)  # expected: y`).
pub fn script_line(line: &str) -> Option<String> {
    let pad: String = line.chars().take_while(|c| *c == ' ').collect();
    let t = line.trim_start();
    if t.contains("ctx") {
        return None;
    }
    if let Some(rest) = t.strip_prefix("with self.assertRaises(") {
        let exc = rest.split(')').next().unwrap_or("Exception");
        return Some(format!("{pad}# expected: raises {exc}"));
    }
    if let Some(rest) = t.strip_prefix("self.assert") {
        let (kind, args) = rest.split_once('(')?;
        let args = args.strip_suffix(')')?;
        let a = split_args(args);
        let first = a.first()?.replace("self.", "");
        let second = a.get(1).map(|s| s.replace("self.", ""));
        let expected = match kind {
            "Equal" | "Is" | "AlmostEqual" => second?,
            "True" => "True".into(),
            "False" => "False".into(),
            "IsNone" => "None".into(),
            "In" => {
                return Some(format!(
                    "{pad}print({})  # expected to contain {first}",
                    second?
                ))
            }
            _ => return None,
        };
        return Some(format!("{pad}print({first})  # expected: {expected}"));
    }
    Some(format!("{pad}{}", t.replace("self.", "")))
}

/// What the failing assertion reports, as a sentence comparing actual and expected.
fn observed(report: &str) -> Option<String> {
    let line = report
        .lines()
        .find(|l| l.starts_with("AssertionError"))?
        .trim();
    let msg = line.strip_prefix("AssertionError: ")?;
    // "Lists differ: [..] != [..]" -> "[..] != [..]"
    let msg = match msg.split_once(": ") {
        Some((head, rest)) if head.ends_with("differ") => rest,
        _ => msg,
    };
    if let Some((a, b)) = msg.split_once(" != ") {
        return Some(format!("I get `{a}` but expected `{}`.", b.trim()));
    }
    if msg.ends_with(" not raised") {
        return Some(format!(
            "No `{}` is raised; the call just returns.",
            msg.trim_end_matches(" not raised")
        ));
    }
    if msg == "False is not true" {
        return Some("It returns `False`, but it should return `True`.".into());
    }
    if msg == "True is not false" {
        return Some("It returns `True`, but it should return `False`.".into());
    }
    if let Some(v) = msg.strip_suffix(" is not None") {
        return Some(format!("I get `{v}` where I expected `None`."));
    }
    Some(format!("The check fails with: `{msg}`."))
}

/// Rewrites a unittest traceback as the user's script traceback: the test frame becomes an
/// `example.py` frame showing `stmt` at line `lineno`; temporary paths become the project path.
fn script_traceback(
    report: &str,
    tmp_prefix: &str,
    project: &str,
    stmt: &str,
    lineno: usize,
) -> String {
    let mut out = Vec::new();
    let mut skipping = false;
    for l in report.lines() {
        let l = l.replace(tmp_prefix, project);
        if skipping {
            if l.starts_with("    ") {
                continue;
            }
            skipping = false;
        }
        if l.trim_start().starts_with("File ") && l.contains("/tests/test_") {
            out.push(format!("  File \"example.py\", line {lineno}, in <module>"));
            out.push(format!("    {stmt}"));
            skipping = true;
            continue;
        }
        out.push(l);
    }
    out.join("\n")
}

/// Replaces object addresses (`at 0x7f...`) so that reports are deterministic.
pub fn scrub_addresses(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(" at 0x") {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 6..];
        let hex = tail.chars().take_while(|c| c.is_ascii_hexdigit()).count();
        rest = &tail[hex..];
    }
    out.push_str(rest);
    out
}

/// Everything the issue writer needs about the failing behaviour.
pub struct Failure<'a> {
    /// Package name.
    pub package: &'a str,
    /// Module the test imports.
    pub module: &'a str,
    /// Test file text.
    pub test_src: &'a str,
    /// Canonical id of the failing test.
    pub test_id: &'a str,
    /// Its FAIL/ERROR report.
    pub report: &'a str,
    /// The temporary folder the run used (scrubbed from paths).
    pub tmp_prefix: &'a str,
    /// Version string of the project.
    pub version: &'a str,
    /// All module names of the project (qualifiers stripped in traceback and behaviour issues).
    pub modules: &'a [String],
}

/// Writes the issue text (title line, blank line, body) in the import style.
pub fn write_issue<R: Rng>(f: &Failure<'_>, rng: &mut R) -> String {
    write_issue_styled(f, IssueStyle::Import, rng)
}

/// The exception line that ends a traceback (`ValueError: ...`), if any.
fn exception_line(report: &str) -> Option<String> {
    report
        .lines()
        .rev()
        .find(|l| {
            let t = l.trim();
            !t.is_empty() && !l.starts_with(' ') && !t.starts_with("Traceback") && t.contains(':')
        })
        .map(|l| l.trim().to_string())
}

/// Writes the issue text (title line, blank line, body) in `style`.
pub fn write_issue_styled<R: Rng>(f: &Failure<'_>, style: IssueStyle, rng: &mut R) -> String {
    // "test_x (tests.test_mod.TestClass.test_x)" -> class, name
    let dotted = f
        .test_id
        .split(" (")
        .nth(1)
        .unwrap_or("")
        .trim_end_matches(')');
    let parts: Vec<&str> = dotted.split('.').collect();
    let (class, name) = if parts.len() >= 2 {
        (parts[parts.len() - 2], parts[parts.len() - 1])
    } else {
        ("", "")
    };
    let (setup, body) = test_body(f.test_src, class, name);
    let plain = style != IssueStyle::Import;
    let fix_line = |l: String| {
        if plain {
            strip_module_refs(&l, f.modules)
        } else {
            l
        }
    };
    let mut script: Vec<String> = if plain {
        Vec::new()
    } else {
        vec![
            format!("from {} import {}", f.package, f.module),
            String::new(),
        ]
    };
    script.extend(setup.iter().filter_map(|l| script_line(l)).map(fix_line));
    script.extend(body.iter().filter_map(|l| script_line(l)).map(fix_line));
    // The failing statement: the last test-file frame's code line.
    let mut stmt = String::new();
    let report = scrub_addresses(f.report);
    let rl: Vec<&str> = report.lines().collect();
    for (k, l) in rl.iter().enumerate() {
        if l.contains("/tests/test_") && l.trim_start().starts_with("File ") {
            stmt = rl
                .get(k + 1)
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
        }
    }
    let call = match script_line(&stmt) {
        Some(s) if s.starts_with("print(") => s
            .strip_prefix("print(")
            .and_then(|x| x.rsplit_once(")  #").map(|(c, _)| c.to_string()))
            .unwrap_or_default(),
        Some(s) if s.contains('(') && !s.starts_with('#') => s.trim().to_string(),
        _ => String::new(),
    };
    let call = fix_line(call);
    let subject = if call.is_empty() && plain {
        format!("`{}`", f.package)
    } else if call.is_empty() {
        format!("`{}.{}`", f.package, f.module)
    } else {
        format!("`{call}`")
    };
    let is_error = !report.lines().any(|l| l.starts_with("AssertionError"));
    let titles = if is_error {
        vec![
            format!("{subject} raises an unexpected exception"),
            format!("Crash when calling {subject}"),
            format!("Exception from {subject}"),
        ]
    } else {
        vec![
            format!("{subject} returns the wrong result"),
            format!("Unexpected output from {subject}"),
            format!("Wrong value from {subject}"),
        ]
    };
    let intros = [
        format!("I'm using {} {} and ran into this:", f.package, f.version),
        "Hi! The following snippet does not behave the way the docstrings describe:".to_string(),
        format!(
            "While moving our code to {} I noticed something odd.",
            f.package
        ),
        "Minimal reproduction:".to_string(),
    ];
    let closings = [
        "",
        "Is this a bug?",
        "Thanks for looking into this.",
        "Could you take a look?",
    ];
    let title = titles.choose(rng).cloned().unwrap_or_default();
    let intro = intros.choose(rng).cloned().unwrap_or_default();
    let closing = closings.choose(rng).copied().unwrap_or("");
    let project = format!("/home/user/{}/", f.package);
    let shown_stmt = script
        .iter()
        .find(|l| !call.is_empty() && l.contains(&call))
        .map(|l| l.split("  #").next().unwrap_or(l).trim().to_string())
        .unwrap_or_else(|| {
            if plain {
                strip_module_refs(&stmt.replace("self.", ""), f.modules)
            } else {
                stmt.clone()
            }
        });
    let lineno = script
        .iter()
        .position(|l| !call.is_empty() && l.contains(&call))
        .map(|k| k + 1)
        .unwrap_or(3);
    let traceback = || script_traceback(&report, f.tmp_prefix, &project, &shown_stmt, lineno);
    let observed_line = |text: &mut String| match observed(&report) {
        Some(o) if !call.is_empty() => text.push_str(&format!("For `{call}`: {o}\n")),
        Some(o) => text.push_str(&format!("{o}\n")),
        None => text.push_str("The output is not what the comments say it should be.\n"),
    };
    let mut text = format!("{title}\n\n");
    match style {
        IssueStyle::Traceback => {
            let lead = [
                "I get this traceback:",
                "Running our job now ends with:",
                "After upgrading I see this:",
            ];
            let lead = lead.choose(rng).copied().unwrap_or("");
            text.push_str(&format!("{lead}\n\n```\n{}\n```\n", traceback()));
            if !is_error {
                text.push('\n');
                observed_line(&mut text);
            }
        }
        IssueStyle::Import | IssueStyle::Behaviour => {
            text.push_str(&format!(
                "{intro}\n\n```python\n{}\n```\n\n",
                script.join("\n")
            ));
            if is_error && style == IssueStyle::Import {
                text.push_str(&format!("This fails with:\n\n```\n{}\n```\n", traceback()));
            } else if is_error {
                let exc = exception_line(&report).unwrap_or_else(|| "an exception".into());
                text.push_str(&format!("It raises `{exc}` instead.\n"));
            } else {
                observed_line(&mut text);
            }
        }
    }
    if !closing.is_empty() {
        text.push_str(&format!("\n{closing}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assertions_become_script_lines() {
        assert_eq!(
            script_line("self.assertEqual(mathutils.clamp(15, 0, 10), 10)").unwrap(),
            "print(mathutils.clamp(15, 0, 10))  # expected: 10"
        );
        assert_eq!(
            script_line("    self.assertTrue(r.contains(geometry.Point(1, 1)))").unwrap(),
            "    print(r.contains(geometry.Point(1, 1)))  # expected: True"
        );
        assert_eq!(
            script_line("with self.assertRaises(ValueError):").unwrap(),
            "# expected: raises ValueError"
        );
        assert_eq!(
            split_args("f(a, b), [1, 2], 'x,y'"),
            vec!["f(a, b)", "[1, 2]", "'x,y'"]
        );
    }
}
