//! A rule's `http` and `inject` blocks: the requests it admits and the
//! headers it sets from secrets. Only an allow rule naming hosts (and no
//! cidrs) may have them: sluice terminates TLS for those connections and
//! needs a name to verify the origin's certificate for.

use super::Checker;
use crate::policy::http::{HttpEntry, Inject, PathPattern, Template};
use crate::policy::yaml::{list, Node, Pos, Value};
use std::collections::HashMap;

const HTTP_KEYS: &[&str] = &["methods", "paths"];
const INJECT_KEYS: &[&str] = &["header", "value"];
/// Headers that frame the message or the connection, or name the origin:
/// sluice (and hyper) own them, and a secret in one would reach the wrong
/// place or break the framing.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

impl Checker {
    /// `http`: a non-empty list of entries.
    pub(super) fn http(&mut self, v: &Node, label: &str) -> Vec<HttpEntry> {
        let items = self.list_of(
            v,
            &format!("{label}'s `http`"),
            "`http: [{methods: [GET], paths: [\"/user\"]}]`",
        );
        if items.is_empty() && matches!(v.value, Value::Seq(_)) {
            self.err(
                v.pos,
                format!("{label} has an empty `http` list; list the methods and paths it admits, or remove `http` to admit every request"),
            );
        }
        items
            .iter()
            .filter_map(|item| self.http_entry(item, label))
            .collect()
    }

    fn http_entry(&mut self, v: &Node, label: &str) -> Option<HttpEntry> {
        let what = format!("an `http` entry of {label}");
        let Value::Map(entries) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "{what} must be a mapping with the keys {}, but it is {}",
                    list(HTTP_KEYS),
                    v.kind()
                ),
            );
            return None;
        };
        let f = self.fields(v, entries, HTTP_KEYS, &what);
        let before = self.problems.len();
        let mut methods = Vec::new();
        match f.get("methods") {
            None => self.err(
                v.pos,
                format!("{what} has no `methods`; add `methods: [GET, HEAD]` (or `[\"*\"]` for any method)"),
            ),
            Some(m) => {
                let items = self.list_of(m, &format!("`methods` of {what}"), "`methods: [GET, HEAD]`");
                if items.is_empty() && matches!(m.value, Value::Seq(_)) {
                    self.err(
                        m.pos,
                        "`methods` is empty, which would admit no request; list methods, like [GET, HEAD], or \"*\" for any",
                    );
                }
                for item in items {
                    if let Some(method) = self.method(item) {
                        if !methods.contains(&method) {
                            methods.push(method);
                        }
                    }
                }
            }
        }
        let mut paths: Vec<PathPattern> = Vec::new();
        match f.get("paths") {
            None => self.err(
                v.pos,
                format!("{what} has no `paths`; add `paths: [\"/user\", \"/repos/**\"]` (`**` for any path: [\"/**\"])"),
            ),
            Some(p) => {
                let items = self.list_of(p, &format!("`paths` of {what}"), "`paths: [\"/user\", \"/repos/*/*\"]`");
                if items.is_empty() && matches!(p.value, Value::Seq(_)) {
                    self.err(
                        p.pos,
                        "`paths` is empty, which would admit no request; list path patterns, like [\"/user\"], or [\"/**\"] for any path",
                    );
                }
                for item in items {
                    let Value::Str(s) = &item.value else {
                        self.err(
                            item.pos,
                            format!(
                                "a path pattern must be a string, but this is {}; write it like \"/repos/*/*\"",
                                item.kind()
                            ),
                        );
                        continue;
                    };
                    match PathPattern::parse(s) {
                        Ok(p) if paths.contains(&p) => {}
                        Ok(p) => paths.push(p),
                        Err(msg) => self.err(item.pos, msg),
                    }
                }
            }
        }
        (self.problems.len() == before).then_some(HttpEntry { methods, paths })
    }

    /// One method: an HTTP token, uppercased, or `*`.
    fn method(&mut self, v: &Node) -> Option<String> {
        let Value::Str(s) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "a method must be a string such as GET, but this is {}",
                    v.kind()
                ),
            );
            return None;
        };
        if s == "*" {
            return Some(s.clone());
        }
        if s.is_empty() || !s.bytes().all(is_tchar) {
            self.err(
                v.pos,
                format!("`{s}` is not an HTTP method; write one like GET, POST or PROPFIND (letters, no spaces), or \"*\" for any"),
            );
            return None;
        }
        Some(s.to_ascii_uppercase())
    }

    /// `inject`: a non-empty list of headers, each named once, whose every
    /// secret is declared in `secrets`.
    pub(super) fn inject(&mut self, v: &Node, label: &str) -> Vec<Inject> {
        let items = self.list_of(
            v,
            &format!("{label}'s `inject`"),
            "`inject: [{header: Authorization, value: \"Bearer {{gh}}\"}]`",
        );
        if items.is_empty() && matches!(v.value, Value::Seq(_)) {
            self.err(
                v.pos,
                format!(
                    "{label} has an empty `inject` list; list headers to set, or remove `inject`"
                ),
            );
        }
        let mut first_at: HashMap<String, Pos> = HashMap::new();
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let Some((inject, at)) = self.inject_entry(item, label) else {
                continue;
            };
            let key = inject.header.to_ascii_lowercase();
            if let Some(first) = first_at.get(&key) {
                self.err(
                    at,
                    format!(
                        "{label} injects `{}` twice (first at line {}); set each header once",
                        inject.header, first.line
                    ),
                );
                continue;
            }
            first_at.insert(key, at);
            out.push(inject);
        }
        out
    }

    /// The entry and where its header name is.
    fn inject_entry(&mut self, v: &Node, label: &str) -> Option<(Inject, Pos)> {
        let what = format!("an `inject` entry of {label}");
        let Value::Map(entries) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "{what} must be a mapping with the keys {}, but it is {}",
                    list(INJECT_KEYS),
                    v.kind()
                ),
            );
            return None;
        };
        let f = self.fields(v, entries, INJECT_KEYS, &what);
        let before = self.problems.len();
        let header = match f.get("header") {
            None => {
                self.err(
                    v.pos,
                    format!(
                        "{what} has no `header`; add `header: Authorization` (the header to set)"
                    ),
                );
                None
            }
            Some(h) => self.header_name(h).map(|name| (name, h.pos)),
        };
        let value = match f.get("value") {
            None => {
                self.err(
                    v.pos,
                    format!("{what} has no `value`; add `value: \"Bearer {{{{name}}}}\"` with a secret from `secrets`"),
                );
                None
            }
            Some(t) => self.template(t),
        };
        let ((header, at), value) = (header?, value?);
        (self.problems.len() == before).then_some((Inject { header, value }, at))
    }

    fn header_name(&mut self, v: &Node) -> Option<String> {
        let Value::Str(s) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "a header name must be a string such as Authorization, but this is {}",
                    v.kind()
                ),
            );
            return None;
        };
        if s.is_empty() || !s.bytes().all(is_tchar) {
            self.err(
                v.pos,
                format!("`{s}` is not a header name; write one like Authorization or X-Api-Key (letters, digits and `-`, no `:` or spaces)"),
            );
            return None;
        }
        let lower = s.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            self.err(
                v.pos,
                format!("sluice cannot inject `{s}`: it frames the request or names the origin, and sluice sets it itself; inject a header such as Authorization instead"),
            );
            return None;
        }
        Some(s.clone())
    }

    fn template(&mut self, v: &Node) -> Option<Template> {
        let Value::Str(s) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "a header value must be a string, but this is {}; write it like \"Bearer {{{{gh}}}}\"",
                    v.kind()
                ),
            );
            return None;
        };
        let template = match Template::parse(s) {
            Ok(t) => t,
            Err(msg) => {
                self.err(v.pos, msg);
                return None;
            }
        };
        let mut unknown: Vec<&str> = template
            .secrets()
            .filter(|n| !self.secret_names.contains(*n))
            .collect();
        unknown.dedup();
        if unknown.is_empty() {
            return Some(template);
        }
        let refs = unknown
            .iter()
            .map(|n| format!("`{{{{{n}}}}}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let message = if self.secret_names.is_empty() {
            format!(
                "the header value refers to {refs}, but the policy has no `secrets`; add `secrets: [{{name: {}, file: /path/to/it}}]` (or `env:` or `command:`)",
                unknown[0]
            )
        } else {
            let mut names: Vec<&str> = self.secret_names.iter().map(String::as_str).collect();
            names.sort_unstable();
            format!(
                "the header value refers to {refs}, which `secrets` does not declare; declare it there or use one of {}",
                list(&names)
            )
        };
        self.err(v.pos, message);
        None
    }
}

/// RFC 9110 `tchar`: what a method or a header name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
