//! The HTML the pages share, written as compile-time templates (maud) that escape
//! every value they are given: the page frame (navigation, the embedded style
//! sheet and script: nothing is fetched from anywhere else), state badges, forms'
//! hidden fields, error pages, ages and links.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use orderly_core::ProcessState;

/// Percent-encodes `s` for a query string.
pub(super) fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The pages of the navigation bar: path and label.
const NAV: [(&str, &str); 6] = [
    ("/", "Overview"),
    ("/orders", "Orders"),
    ("/errors", "Errors"),
    ("/alerts", "Alerts"),
    ("/workflows", "Workflows"),
    ("/dead-letters", "Dead letters"),
];

/// The style sheet: one layout for a 1280 px screen and a phone, a colour per state.
const STYLE: &str = r#"
:root{--bg:#f5f6f8;--card:#fff;--ink:#1d2430;--muted:#6b7280;--line:#e3e6ea;
--Pending:#2563eb;--Processing:#d97706;--Processed:#15803d;--Error:#b91c1c;--Cancelled:#6b7280;--accent:#4f46e5}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);background:var(--bg)}
header{background:#111827;color:#fff;padding:.6rem 1rem;display:flex;flex-wrap:wrap;gap:.4rem 1.2rem;align-items:center}
header b{font-size:1.05rem;letter-spacing:.02em;margin-right:.6rem}
header a{color:#cbd5e1;text-decoration:none;padding:.25rem .1rem;border-bottom:2px solid transparent}
header a.on,header a:hover{color:#fff;border-color:#818cf8}
header form{margin-left:auto;display:flex;gap:.3rem}
header input{padding:.3rem .5rem;border-radius:6px;border:0;min-width:12rem}
main{max-width:1240px;margin:0 auto;padding:1rem}
h1{font-size:1.35rem;margin:.2rem 0 1rem}h2{font-size:1.05rem;margin:0 0 .6rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:1rem;margin-bottom:1rem;box-shadow:0 1px 2px rgba(0,0,0,.04)}
.grid{display:grid;gap:1rem;grid-template-columns:repeat(auto-fit,minmax(340px,1fr))}
.charts{grid-template-columns:repeat(auto-fit,minmax(520px,1fr))}
td.mono a,td.mono{white-space:nowrap}
a.act{display:inline-block;padding:.2rem .6rem;border-radius:6px;background:var(--accent);color:#fff;text-decoration:none;margin:.1rem 0}
a.act.danger{background:var(--Error)}
.tiles{display:grid;gap:.7rem;grid-template-columns:repeat(auto-fit,minmax(130px,1fr))}
.tile{border-radius:8px;padding:.6rem .8rem;background:#f9fafb;border-left:4px solid var(--c,#999)}
.tile .n{font-size:1.6rem;font-weight:600}.tile a{color:inherit;text-decoration:none}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid var(--line);padding:.4rem .55rem;text-align:left;vertical-align:top}
th{font-weight:600;color:var(--muted);font-size:.8rem;text-transform:uppercase;letter-spacing:.03em}
tr:nth-child(even) td{background:#fafbfc}
a{color:var(--accent)}
.badge{display:inline-block;padding:.05rem .5rem;border-radius:999px;font-size:.8rem;font-weight:600;color:#fff;background:var(--c,#999)}
.Pending{--c:var(--Pending)}.Processing{--c:var(--Processing)}.Processed{--c:var(--Processed)}
.Error{--c:var(--Error)}.Cancelled{--c:var(--Cancelled)}
.ok{color:var(--Processed)}.bad{color:var(--Error)}.warn{color:var(--Processing)}.muted{color:var(--muted)}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem}
form.inline{display:inline}
form.filters{display:flex;flex-wrap:wrap;gap:.5rem;align-items:flex-end}
form.filters label{display:flex;flex-direction:column;font-size:.8rem;color:var(--muted)}
input,select,button{font:inherit;padding:.35rem .55rem;border:1px solid #cbd5e1;border-radius:6px;background:#fff}
button{background:var(--accent);color:#fff;border-color:var(--accent);cursor:pointer}
button.danger{background:var(--Error);border-color:var(--Error)}
button.plain{background:#fff;color:var(--ink);border-color:#cbd5e1}
.chart svg{width:100%;height:auto;display:block}
.legend span{margin-right:1rem;font-size:.8rem}.legend i{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;margin-right:.3rem;vertical-align:-1px}
.notice{padding:.6rem .8rem;border-radius:8px;background:#eef2ff;border:1px solid #c7d2fe;margin-bottom:1rem}
.notice.bad{background:#fef2f2;border-color:#fecaca}
@media (max-width:640px){main{padding:.5rem}header form{margin-left:0;width:100%}header input{flex:1;min-width:0}
th,td{padding:.35rem .4rem}.grid,.charts{grid-template-columns:1fr}}
"#;

/// The script: lists (tables marked `data-refresh`) are read again every 5 s and
/// replaced, unless the operator is ticking orders or typing; pages that show live
/// figures poll `/api/overview` and redraw the charts
/// every 15 s. Nothing else needs it: every page works without it.
const SCRIPT: &str = r#"
(function(){
  const live=document.querySelector('[data-live]');
  if(!live)return;
  async function tick(){
    try{
      const r=await fetch('/api/overview',{headers:{accept:'application/json'}});
      if(!r.ok)return;
      const d=await r.json();
      for(const [k,v] of Object.entries(d.counts||{})){
        const el=document.getElementById('count-'+k);if(el)el.textContent=v;}
      for(const q of d.queues||[]){
        for(const f of ['ready','locked','scheduled','dead_lettered']){
          const el=document.getElementById('q-'+q.queue+'-'+f);if(el)el.textContent=q[f];}}
      const l=document.getElementById('leader');if(l&&d.leader)l.innerHTML=d.leader;
      const s=document.getElementById('updated');if(s)s.textContent=new Date().toLocaleTimeString();
    }catch(e){}
  }
  async function charts(){
    try{
      const r=await fetch('/charts'+location.search);if(!r.ok)return;
      const c=document.getElementById('charts');if(c)c.innerHTML=await r.text();
    }catch(e){}
  }
  setInterval(tick,2000);setInterval(charts,15000);
})();
(function(){
  // Lists (tables marked data-refresh) are read again every 5 s from the same address
  // and replaced in place, but not while an order is ticked or a field is in use.
  if(!document.querySelector('table[data-refresh]'))return;
  function busy(){
    const a=document.activeElement;
    if(a&&a.form&&a.type!=='submit'&&a.tagName!=='BUTTON')return true;
    return !!document.querySelector('input[type=checkbox]:checked');
  }
  async function refresh(){
    if(busy())return;
    try{
      const r=await fetch(location.href,{headers:{accept:'text/html'}});
      if(!r.ok||busy())return;
      const fresh=new DOMParser().parseFromString(await r.text(),'text/html');
      for(const el of document.querySelectorAll('table[data-refresh]')){
        const now=fresh.getElementById(el.id);if(now)el.replaceWith(document.importNode(now,true));}
    }catch(e){}
  }
  setInterval(refresh,5000);
})();
"#;

/// A page: the navigation bar (with `active` marked and the order search), the title
/// and `body`. Every text in it is escaped by the template; only the style sheet and
/// the script, constants of this file, go in as they are.
pub(super) fn page(title: &str, active: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width,initial-scale=1";
                    title { (title) " - orderly" }
                    style { (PreEscaped(STYLE)) }
                }
                body {
                    header {
                        b { "orderly" }
                        @for (path, label) in NAV {
                            a href=(path) class=[(path == active).then_some("on")] { (label) }
                        }
                        form action="/orders" method="get" role="search" {
                            input name="id" placeholder="Find an order by id" aria-label="order id";
                            button { "Find" }
                        }
                    }
                    main {
                        h1 { (title) }
                        (body)
                    }
                    script { (PreEscaped(SCRIPT)) }
                }
            }
        }
        .into_string(),
    )
}

/// The badge of a state, coloured.
pub(super) fn badge(state: ProcessState) -> Markup {
    html! { span class={"badge " (state.as_str())} { (state.as_str()) } }
}

/// The hidden and visible fields every action form carries: the CSRF token, and who
/// acts (remembered from the last action).
pub(super) fn action_fields(csrf: &str, operator: &str) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(csrf);
        input name="operator" value=(operator) size="10" required aria-label="your name"
            title="your name, recorded with the action";
    }
}

/// A notice that something went wrong (`bad`) or was done.
pub(super) fn notice(bad: bool, text: &str) -> Markup {
    html! { p class=(if bad { "notice bad" } else { "notice" }) { (text) } }
}

pub(super) fn failed(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        page("Unavailable", "", notice(true, &e.to_string())),
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

/// A time as operators read it (UTC).
pub(super) fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(url("a b/c&d=é"), "a+b%2Fc%26d%3D%C3%A9");
        assert_eq!(url("step-1_x.y~"), "step-1_x.y~");
    }
}
