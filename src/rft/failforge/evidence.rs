//! What an issue text says about where its code lives: the frames of a traceback it quotes, the
//! `from pkg import mod` lines of its snippets and the calls it writes. The rule diagnoser reads
//! it to choose a skill; the skill-following teacher reads it to follow one.

/// One `File "path", line N, in func` frame of a traceback quoted in the issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The path as quoted.
    pub path: String,
    /// The line number (0 when unreadable).
    pub line: usize,
    /// The function (empty when the frame names none).
    pub func: String,
}

/// Evidence an issue text gives.
#[derive(Clone, Debug, Default)]
pub struct IssueEvidence {
    /// Traceback frames, outermost first.
    pub frames: Vec<Frame>,
    /// `from pkg import mod` lines, verbatim.
    pub imports: Vec<String>,
    /// `pkg/mod.py` paths the import lines imply, one per imported name.
    pub import_paths: Vec<String>,
    /// `name(` calls, dotted names kept.
    pub calls: Vec<String>,
}

fn frame_of(rest: &str) -> Option<Frame> {
    let (path, tail) = rest.split_once('"')?;
    let line = tail
        .split(", line ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let func = tail
        .split_once(", in ")
        .map(|(_, f)| f.trim().to_string())
        .unwrap_or_default();
    Some(Frame {
        path: path.to_string(),
        line,
        func,
    })
}

impl IssueEvidence {
    /// The evidence of `problem`.
    pub fn of(problem: &str) -> Self {
        let mut ev = IssueEvidence::default();
        for line in problem.lines().map(str::trim) {
            if let Some(f) = line.strip_prefix("File \"").and_then(frame_of) {
                ev.frames.push(f);
            }
            if let Some((pkg, names)) = line
                .strip_prefix("from ")
                .and_then(|r| r.split_once(" import "))
            {
                ev.imports.push(line.to_string());
                for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    ev.import_paths
                        .push(format!("{}/{}.py", pkg.trim().replace('.', "/"), name));
                }
            }
        }
        for word in
            problem.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '('))
        {
            if let Some((name, _)) = word.split_once('(') {
                let name = name.trim_matches('.');
                if name.len() > 2
                    && name
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_alphabetic() || c == '_')
                {
                    ev.calls.push(name.to_string());
                }
            }
        }
        ev
    }

    /// The deepest traceback frame that is not inside the standard library or site-packages.
    pub fn deepest_repo_frame(&self) -> Option<&Frame> {
        self.frames
            .iter()
            .rev()
            .find(|f| !f.path.contains("site-packages") && !f.path.contains("/lib/python"))
    }

    /// Whether the repository path `path` is the file `quoted` names (absolute or relative).
    pub fn same_file(path: &str, quoted: &str) -> bool {
        quoted == path || quoted.ends_with(&format!("/{path}"))
    }

    /// Whether `path` is a module one of the issue's import lines imports.
    pub fn imports_path(&self, path: &str) -> bool {
        self.import_paths
            .iter()
            .any(|p| p == path || path.ends_with(&format!("/{p}")))
    }

    /// Whether the issue calls a name whose last part is the last part of `name`.
    pub fn calls_name(&self, name: &str) -> bool {
        let last = name.rsplit('.').next().unwrap_or(name);
        self.calls
            .iter()
            .any(|c| c.rsplit('.').next() == Some(last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_imports_and_calls_are_read() {
        let ev = IssueEvidence::of(
            "Crash:\n```\nfrom acme.pkg import core, util\ncore.scale(3)\n```\nTraceback:\n  File \"/usr/lib/python3.11/runpy.py\", line 1, in run\n  File \"/home/u/acme/pkg/core.py\", line 7, in scale\n",
        );
        assert_eq!(
            ev.import_paths,
            vec!["acme/pkg/core.py", "acme/pkg/util.py"]
        );
        assert!(ev.imports_path("src/acme/pkg/core.py"));
        assert!(!ev.imports_path("acme/pkg/other.py"));
        let f = ev.deepest_repo_frame().unwrap();
        assert_eq!((f.line, f.func.as_str()), (7, "scale"));
        assert!(IssueEvidence::same_file("pkg/core.py", &f.path));
        assert!(ev.calls_name("Engine.scale") && !ev.calls_name("helper"));
    }
}
