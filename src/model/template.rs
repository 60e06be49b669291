//! A model's own chat template: the Jinja `chat_template` of its `tokenizer_config.json` (or the
//! `chat_template.jinja` beside it), rendered like transformers' `apply_chat_template`.
//!
//! The engine is minijinja with minijinja-contrib's Python-compatibility methods (`.strip()`,
//! `.startswith()`, `.split()`, ...), what Hugging Face's text-generation-inference and mistral.rs
//! use; it is configured like transformers' sandboxed jinja2 environment: `trim_blocks`,
//! `lstrip_blocks`, loop controls, and the globals `raise_exception` and `strftime_now`. The
//! variables are transformers': `messages`, `add_generation_prompt`, `tools` and `documents`
//! (none), and the special tokens of the tokenizer config (`bos_token`, `eos_token`, ...).
//!
//! transformers' `{% generation %}...{% endgeneration %}` tag, which marks what the assistant
//! writes, becomes a filter block that brackets its output with two private-use characters, so
//! one render gives both the text and the assistant spans.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, Error as JinjaError, ErrorKind, Value};
use serde_json::Value as Json;

use crate::model::error::{ModelError, Result};

/// The template's name inside its environment.
const NAME: &str = "chat_template";
/// Marks the start of a `{% generation %}` block in rendered text.
const GEN_START: char = '\u{F8F0}';
/// Marks the end of a `{% generation %}` block in rendered text.
const GEN_END: char = '\u{F8F1}';

/// One message as a template sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TemplateMessage<'a> {
    /// `system`, `user` or `assistant`.
    pub role: &'a str,
    /// The text.
    pub content: &'a str,
}

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    origin: PathBuf,
    specials: BTreeMap<String, Json>,
    has_generation: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("has_generation", &self.has_generation)
            .finish()
    }
}

/// The text of a special token in `tokenizer_config.json`: a string or `{"content": ...}`.
pub fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// The special-token variables transformers passes to a template, from a tokenizer config.
fn special_tokens(config: &Json) -> BTreeMap<String, Json> {
    let mut out = BTreeMap::new();
    for key in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ] {
        if let Some(t) = config.get(key).and_then(token_text) {
            out.insert(key.to_string(), Json::String(t));
        }
    }
    if let Some(Json::Array(a)) = config.get("additional_special_tokens") {
        let list: Vec<Json> = a.iter().filter_map(token_text).map(Json::String).collect();
        out.insert("additional_special_tokens".into(), Json::Array(list));
    }
    out
}

/// The template source of a `chat_template` value: a string, or a list of `{name, template}`
/// from which transformers takes the one named `default`.
fn template_source(v: &Json, path: &Path) -> Result<String> {
    match v {
        Json::String(s) => Ok(s.clone()),
        Json::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                ModelError::invalid(
                    path,
                    "chat_template",
                    "a list of templates without \"default\"",
                )
            }),
        other => Err(ModelError::invalid(
            path,
            "chat_template",
            format!("expected a string or a list of named templates, got {other}"),
        )),
    }
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` as a filter block marking its output.
fn rewrite_generation(source: &str) -> (String, bool) {
    // A static, valid pattern: compiling it cannot fail.
    let open = regex::Regex::new(r"\{%([-+]?)\s*generation\s*([-+]?)%\}").expect("valid regex");
    let close = regex::Regex::new(r"\{%([-+]?)\s*endgeneration\s*([-+]?)%\}").expect("valid regex");
    let has = open.is_match(source);
    let s = open.replace_all(source, "{%${1} filter __sorft_generation ${2}%}");
    let s = close.replace_all(&s, "{%${1} endfilter ${2}%}");
    (s.into_owned(), has)
}

/// Formats the local time like Python's `datetime.now().strftime(fmt)`.
fn strftime_now(fmt: String) -> std::result::Result<String, JinjaError> {
    let bad = || JinjaError::new(ErrorKind::InvalidOperation, "strftime_now: invalid format");
    let cfmt = std::ffi::CString::new(fmt).map_err(|_| bad())?;
    let mut buf = vec![0u8; 256];
    // SAFETY: `time` and `localtime_r` write only to the locals passed; `strftime` writes at most
    // `buf.len()` bytes into `buf` and reads the NUL-terminated `cfmt`.
    let n = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return Err(bad());
        }
        libc::strftime(buf.as_mut_ptr().cast(), buf.len(), cfmt.as_ptr(), &tm)
    };
    buf.truncate(n);
    String::from_utf8(buf).map_err(|_| bad())
}

impl ChatTemplate {
    /// Compiles a template; `origin` (the file it came from) names it in errors, `config` is the
    /// tokenizer config whose special tokens the template sees.
    pub fn new(source: &str, origin: &Path, config: &Json) -> Result<Self> {
        let (source, has_generation) = rewrite_generation(source);
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ModelError::invalid(origin, "chat_template", e.to_string()))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", crate::model::tojson::tojson);
        env.add_filter("__sorft_generation", |s: String| {
            format!("{GEN_START}{s}{GEN_END}")
        });
        env.add_template_owned(NAME, source)
            .map_err(|e| ModelError::invalid(origin, "chat_template", describe(&e)))?;
        Ok(Self {
            env,
            origin: origin.to_path_buf(),
            specials: special_tokens(config),
            has_generation,
        })
    }

    /// Loads the template of a model directory: `chat_template.jinja` when present, else
    /// `chat_template` in `tokenizer_config.json`; `None` when neither exists.
    pub fn load(dir: &Path, config: &Json) -> Result<Option<Self>> {
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let src = std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?;
            return Self::new(&src, &jinja, config).map(Some);
        }
        let cfg_path = dir.join("tokenizer_config.json");
        match config.get("chat_template") {
            None | Some(Json::Null) => Ok(None),
            Some(v) => Self::new(&template_source(v, &cfg_path)?, &cfg_path, config).map(Some),
        }
    }

    /// The file the template came from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Whether the template marks assistant text with `{% generation %}` blocks.
    pub fn has_generation(&self) -> bool {
        self.has_generation
    }

    /// The text of a special token variable (`eos_token`, ...), if the config names it.
    pub fn special(&self, name: &str) -> Option<&str> {
        self.specials.get(name).and_then(Json::as_str)
    }

    /// Renders a conversation, with the assistant opener when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        Ok(self.render_marked(messages, add_generation_prompt)?.0)
    }

    /// Renders a conversation and returns the byte ranges of its `{% generation %}` blocks.
    pub fn render_marked(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<Range<usize>>)> {
        if messages.iter().any(|m| {
            m.content.contains([GEN_START, GEN_END]) || m.role.contains([GEN_START, GEN_END])
        }) {
            return Err(ModelError::Input(format!(
                "a message contains the reserved characters U+{:X}/U+{:X}",
                GEN_START as u32, GEN_END as u32
            )));
        }
        let mut ctx: BTreeMap<String, Value> = self
            .specials
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(minijinja::value::Serde(v))))
            .collect();
        ctx.insert(
            "messages".into(),
            Value::from(minijinja::value::Serde(messages)),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        let tmpl = self.env.get_template(NAME).map_err(|e| self.error(&e))?;
        let marked = tmpl.render(ctx).map_err(|e| self.error(&e))?;
        split_marks(&marked).ok_or_else(|| {
            ModelError::invalid(
                &self.origin,
                "chat_template",
                "unbalanced {% generation %} blocks",
            )
        })
    }

    fn error(&self, e: &JinjaError) -> ModelError {
        ModelError::invalid(&self.origin, "chat_template", describe(e))
    }
}

/// One line describing a template error: its kind, detail and line.
fn describe(e: &JinjaError) -> String {
    let mut s = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (template line {line})"));
    }
    s
}

/// Removes generation marks from rendered text, returning the text and the marked byte ranges;
/// `None` when the marks are unbalanced.
fn split_marks(marked: &str) -> Option<(String, Vec<Range<usize>>)> {
    let mut text = String::with_capacity(marked.len());
    let mut spans = Vec::new();
    let mut open: Option<usize> = None;
    for c in marked.chars() {
        match c {
            GEN_START if open.is_none() => open = Some(text.len()),
            GEN_END => {
                let start = open.take()?;
                if start < text.len() {
                    spans.push(start..text.len());
                }
            }
            GEN_START => return None,
            c => text.push(c),
        }
    }
    open.is_none().then_some((text, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<TemplateMessage<'a>> {
        pairs
            .iter()
            .map(|&(role, content)| TemplateMessage { role, content })
            .collect()
    }

    fn tmpl(src: &str) -> ChatTemplate {
        let cfg = serde_json::json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}});
        ChatTemplate::new(src, Path::new("t.json"), &cfg).unwrap()
    }

    #[test]
    fn trims_blocks_like_transformers_and_sees_special_tokens() {
        let t = tmpl("{{ bos_token }}\n{% for m in messages %}\n  {{ m.role }}:{{ m.content | trim }}{{ eos_token }}\n{% endfor %}\n");
        let s = t.render(&msgs(&[("user", " hi ")]), false).unwrap();
        assert_eq!(s, "<s>\n  user:hi</s>\n");
    }

    #[test]
    fn python_methods_namespaces_and_negative_indices_work() {
        let t = tmpl("{% set ns = namespace(n=0) %}{% for m in messages[::-1] %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|{{ messages[-1].content.split('</think>')[-1].lstrip('\\n') }}|{{ messages[0].content.startswith('a') }}");
        let s = t
            .render(
                &msgs(&[("user", "ab"), ("assistant", "x</think>\n\ny")]),
                false,
            )
            .unwrap();
        assert_eq!(s, "2|y|True");
    }

    #[test]
    fn generation_blocks_give_assistant_spans() {
        let t = tmpl("{% for m in messages %}[{{ m.role }}]{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}");
        assert!(t.has_generation());
        let (text, spans) = t
            .render_marked(
                &msgs(&[
                    ("user", "q"),
                    ("assistant", "a1"),
                    ("user", "r"),
                    ("assistant", "a2"),
                ]),
                false,
            )
            .unwrap();
        assert_eq!(text, "[user]q[assistant]a1</s>[user]r[assistant]a2</s>");
        let got: Vec<&str> = spans.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(got, ["a1</s>", "a2</s>"]);
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let cfg = serde_json::json!({});
        let e = ChatTemplate::new("{% for %}", Path::new("dir/tokenizer_config.json"), &cfg)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("dir/tokenizer_config.json: chat_template:"),
            "{e}"
        );
        let t = tmpl("{{ raise_exception('roles must alternate') }}");
        let e = t.render(&[], false).unwrap_err().to_string();
        assert!(
            e.contains("roles must alternate") && e.contains("t.json"),
            "{e}"
        );
        let t = tmpl("{{ messages | no_such_filter }}");
        let e = t.render(&[], false).unwrap_err().to_string();
        assert!(
            e.contains("no_such_filter") || e.contains("unknown filter"),
            "{e}"
        );
        let e = template_source(
            &serde_json::json!([{"name": "tool_use", "template": "x"}]),
            Path::new("c.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("default"), "{e}");
        assert_eq!(
            template_source(
                &serde_json::json!([{"name": "default", "template": "x"}]),
                Path::new("c.json")
            )
            .unwrap(),
            "x"
        );
    }

    #[test]
    fn strftime_now_formats_the_date() {
        let t = tmpl("{{ strftime_now('%Y') }}");
        let y = t.render(&[], false).unwrap();
        assert!(y.len() == 4 && y.chars().all(|c| c.is_ascii_digit()), "{y}");
    }
}
