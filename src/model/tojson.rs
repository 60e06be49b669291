//! transformers' `tojson` template filter: Python's `json.dumps` layout (`", "` and `": "`
//! separators, `indent`, `sort_keys`, no HTML escaping), which minijinja's own `tojson` (HTML-safe,
//! escaping `<`, `>`, `&` and `'`) does not match byte for byte.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error as JinjaError, ErrorKind, Value};

/// Python's `json.dumps` layout: separators and indentation.
struct PyJson {
    item_sep: String,
    key_sep: String,
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn string(&self, s: &str, out: &mut String) {
        // serde_json escapes exactly what Python's json does with ensure_ascii=False.
        let quoted = serde_json::to_string(s).unwrap_or_default();
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }

    fn newline(&self, level: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    }

    fn write(
        &self,
        v: &Value,
        level: usize,
        out: &mut String,
    ) -> std::result::Result<(), JinjaError> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&v.to_string()),
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', &items, level, out, |item, out| {
                    self.write(item, level + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.container('{', '}', &keys, level, out, |k, out| {
                    self.string(&k.to_string(), out);
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(k)?, level + 1, out)
                })?;
            }
            _ => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: cannot serialize a {}", v.kind()),
                ))
            }
        }
        Ok(())
    }

    fn container(
        &self,
        open: char,
        close: char,
        items: &[Value],
        level: usize,
        out: &mut String,
        mut each: impl FnMut(&Value, &mut String) -> std::result::Result<(), JinjaError>,
    ) -> std::result::Result<(), JinjaError> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(level + 1, out);
            each(item, out)?;
        }
        self.newline(level, out);
        out.push(close);
        Ok(())
    }
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)` (minijinja's own escapes `<`, `>`, `&` and `'` for HTML).
pub fn tojson(
    v: &Value,
    indent: Option<Value>,
    kw: Kwargs,
) -> std::result::Result<Value, JinjaError> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kw.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        Some(i) if !i.is_none() => Some(usize::try_from(i)?),
        _ => None,
    };
    let seps: Option<Vec<String>> = kw.get("separators")?;
    let (item_sep, key_sep) = match seps.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let fmt = PyJson {
        item_sep,
        key_sep,
        indent,
        sort_keys: kw.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kw.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kw.assert_all_used()?;
    let mut out = String::new();
    fmt.write(v, 0, &mut out)?;
    Ok(Value::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let src = "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true, separators=[',', ':']) }}|{{ 'é<' | tojson(ensure_ascii=true) }}";
        let inner = Value::from_pairs([
            ("b", Value::from(vec![1, 2])),
            ("a", Value::from("é<&'\n")),
            ("c", Value::from(())),
        ]);
        let x = Value::from_pairs([("x", inner)]);
        let s = env.render_str(src, x).unwrap();
        // Expected strings from Python 3.11: json.dumps(x, ensure_ascii=False, ...).
        assert_eq!(
            s,
            "{\"b\": [1, 2], \"a\": \"é<&'\\n\", \"c\": null}|{\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": \"é<&'\\n\",\n  \"c\": null\n}|{\"a\":\"é<&'\\n\",\"b\":[1,2],\"c\":null}|\"\\u00e9<\""
        );
    }
}
