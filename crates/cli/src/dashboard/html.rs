//! The HTML the pages share: escaping, the page frame, error pages, ages.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

/// HTML-escapes `s`.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn page(title: &str, body: &str) -> Html<String> {
    Html(format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{t} - orderly</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}nav a{{margin-right:1em}}\
         table{{border-collapse:collapse;margin:.5em 0}}td,th{{border-bottom:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}}\
         .Error{{color:#b00}}.Processed{{color:#080}}.muted{{color:#777}}form.inline{{display:inline}}</style></head>\
         <body><nav><b>orderly</b> <a href=\"/\">Overview</a><a href=\"/errors\">Errors</a><a href=\"/dead-letters\">Dead letters</a></nav>\
         <h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    ))
}

pub(super) fn failed(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        page("Unavailable", &format!("<p>{}</p>", esc(&e.to_string()))),
    )
        .into_response()
}

pub(super) fn ago(t: chrono::DateTime<chrono::Utc>) -> String {
    let s = (chrono::Utc::now() - t).num_seconds().max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86400),
    }
}
