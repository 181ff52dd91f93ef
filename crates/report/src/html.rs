//! The HTML page of a bundle: one self-contained document (inline CSS, no script, no external resource), every
//! text from the bundle escaped on the way out.

use std::fmt::Write;

use hangwatch_model::{duration_text, Culprit, Verdict, VerdictKind};

use crate::bundle::{Bundle, Problem};
use crate::escape::{escape, Esc};
use crate::grid::{self, Cell, NodeRow};

/// Above this many ranks the grid uses small cells without rank numbers.
const BIG_CELLS_UP_TO: usize = 256;
/// Above this many nodes, node rows flow into several columns.
const FLOW_NODES_ABOVE: usize = 40;
/// A node with more ranks than this wraps its cells onto further lines.
const MAX_COLUMNS: usize = 64;

/// Waiting groups' colours; groups holding a culprit get [`CULPRIT_COLOURS`].
const COLOURS: [&str; 8] = [
    "#4e79a7", "#59a14f", "#76b7b2", "#b07aa1", "#edc948", "#9c755f", "#ff9da7", "#8cd17d",
];
const CULPRIT_COLOURS: [&str; 2] = ["#e15759", "#f28e2b"];
const NO_GROUP_COLOUR: &str = "#c8c8c8";

/// The whole page.
pub fn render_html(bundle: &Bundle) -> String {
    let v = &bundle.verdict;
    let rows = grid::layout(v);
    let ranks: usize = rows.iter().map(|r| r.cells.len()).sum();
    let mut page = String::with_capacity(16 * 1024 + ranks * 120);
    let out = &mut page;
    head(out, v, &rows);
    header(out, bundle);
    todo(out, v);
    for (i, culprit) in v.culprits.iter().enumerate() {
        culprit_section(out, bundle, culprit, i, v.culprits.len());
    }
    grid_section(out, v, &rows, ranks);
    filesystems(out, bundle);
    kernel(out, bundle);
    progress(out, bundle);
    run_section(out, bundle);
    files(out, bundle);
    out.push_str("</main></body></html>\n");
    page
}

fn kind_text(kind: VerdictKind) -> &'static str {
    match kind {
        VerdictKind::BlockedInKernel => "blocked in kernel",
        VerdictKind::Stopped => "stopped",
        VerdictKind::Exited => "a rank exited",
        VerdictKind::Diverged => "diverged",
        VerdictKind::Busy => "busy",
        VerdictKind::CollectiveHang => "collective hang",
        VerdictKind::NodeUnreachable => "node unreachable",
        VerdictKind::Unknown => "unknown",
    }
}

fn state_text(state: &str) -> &'static str {
    match state.chars().next() {
        Some('D') => "uninterruptible sleep",
        Some('S') => "sleeping",
        Some('R') => "running",
        Some('T') => "stopped",
        Some('t') => "stopped by a tracer",
        Some('Z') => "zombie",
        Some('X') => "exited",
        Some('I') => "idle",
        _ => "unknown",
    }
}

/// The CSS class of a state letter; states that matter get their own look.
fn state_class(state: &str) -> &'static str {
    match state.chars().next() {
        Some('D') => "sD",
        Some('T' | 't') => "sT",
        Some('Z' | 'X') => "sZ",
        Some('R') => "sR",
        _ => "",
    }
}

/// Seconds since the epoch as a UTC date and time (model's one civil-time formatting).
pub use hangwatch_model::utc_time as time_text;

/// Each group's colour, by index into `verdict.groups`: groups that hold a culprit are hot, the others cool.
fn group_colours(v: &Verdict) -> Vec<&'static str> {
    let culprit_ranks: Vec<u32> = v.culprits.iter().filter_map(|c| c.rank).collect();
    let (mut hot, mut cool) = (0, 0);
    v.groups
        .iter()
        .map(|g| {
            if g.ranks.iter().any(|r| culprit_ranks.contains(r)) {
                hot += 1;
                CULPRIT_COLOURS[(hot - 1) % CULPRIT_COLOURS.len()]
            } else {
                cool += 1;
                COLOURS[(cool - 1) % COLOURS.len()]
            }
        })
        .collect()
}

const STYLE: &str = r#"
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d1d1f;background:#f4f5f7}
main{max-width:1360px;margin:0 auto;padding:0 20px 40px}
header.verdict{background:#1d1d1f;color:#fff;padding:22px 28px 18px;margin:0 -20px 18px;border-bottom:6px solid var(--kind)}
header .kind{display:inline-block;background:var(--kind);color:#fff;font-weight:700;letter-spacing:.06em;text-transform:uppercase;font-size:13px;padding:3px 10px;border-radius:4px}
header h1{font-size:22px;line-height:1.35;margin:10px 0 8px;font-weight:600;overflow-wrap:anywhere}
header .meta{color:#c9ccd1;font-size:14px;margin:0}
header .meta b{color:#fff;font-weight:600}
header .recurrence{margin:10px 0 0;padding:6px 10px;background:#5c1d1d;border-left:4px solid #ff6b6b;color:#fff;font-weight:600;font-size:14px}
header .recurrence code{color:#ffd2d2}
section{background:#fff;border:1px solid #dfe1e5;border-radius:8px;padding:14px 20px 16px;margin:0 0 16px}
h2{font-size:17px;margin:0 0 10px}
h3{font-size:14px;margin:14px 0 6px;color:#444;text-transform:uppercase;letter-spacing:.04em}
.todo{border-left:6px solid #c00}
.todo ol{margin:0;padding-left:22px}.todo li{margin:3px 0}
.culprit-box{border-left:6px solid #e15759}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:3px 16px;margin:0}
dl.facts dt{color:#666}dl.facts dd{margin:0;overflow-wrap:anywhere}
.bad{color:#b00;font-weight:700}.ok{color:#17702e;font-weight:600}.muted{color:#777}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:18px}
ol.stack{margin:0;padding-left:26px;font:13px/1.5 ui-monospace,"DejaVu Sans Mono",monospace}
ol.stack li:first-child{font-weight:700}
pre{background:#f6f8fa;border:1px solid #e5e7eb;border-radius:6px;padding:8px 10px;font:12.5px/1.45 ui-monospace,"DejaVu Sans Mono",monospace;overflow:auto;max-height:420px;white-space:pre-wrap;overflow-wrap:anywhere;margin:0}
pre.tail{max-height:none}
code{font:13px ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;font-size:14px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eee;vertical-align:top;overflow-wrap:anywhere}
th{color:#555;font-weight:600;background:#fafafa;white-space:nowrap}
.grid{margin:6px 0 10px}
.grid.flow{column-width:var(--roww);column-gap:18px}
.node{display:flex;align-items:flex-start;gap:8px;margin:0 0 3px;break-inside:avoid}
.nn{flex:0 0 auto;min-width:60px;font:12px/var(--cell) ui-monospace,"DejaVu Sans Mono",monospace;color:#444;text-align:right;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;max-width:160px}
.cells{display:grid;grid-template-columns:repeat(var(--cols),var(--cell));gap:2px}
.cells i{display:block;width:var(--cell);height:var(--cell);border-radius:2px;font:700 9px/var(--cell) ui-monospace,monospace;color:#fff;text-align:center;font-style:normal;overflow:hidden}
.big .cells i{font-size:14px;line-height:1.1;padding-top:4px;border-radius:4px}
.big .cells i u{display:block;text-decoration:none;font-size:12px}
.cells i.sD{box-shadow:inset 0 0 0 3px #5a0000}
.cells i.sT{background-image:repeating-linear-gradient(45deg,rgba(0,0,0,.35) 0 2px,transparent 2px 5px)}
.cells i.sZ{opacity:.45;box-shadow:inset 0 0 0 2px #000}
.cells i.culprit{outline:3px solid #000;outline-offset:2px;position:relative;z-index:1}
.mark{flex:0 0 auto;color:#b00;font-weight:700;font-size:13px;line-height:var(--cell);white-space:nowrap}
.legend{display:flex;flex-direction:column;gap:4px;margin-top:8px;font-size:14px}
.legend .sw{display:inline-block;width:14px;height:14px;border-radius:3px;vertical-align:-2px;margin-right:6px}
.states{color:#555;font-size:13px;margin-top:8px}
.states span{margin-right:16px;white-space:nowrap}
.states .sw{display:inline-block;width:14px;height:14px;border-radius:2px;vertical-align:-3px;margin-right:4px;background:#888;color:#fff;font:700 9px/14px monospace;text-align:center}
svg.timeline{display:block;max-width:100%;font-family:inherit}
details>summary{cursor:pointer;color:#1f4e8c;margin:6px 0}
.missing{color:#8a5a00}
@media (max-width:900px){.cols{grid-template-columns:1fr}}
"#;

fn head(out: &mut String, v: &Verdict, rows: &[NodeRow<'_>]) {
    let title = match v.culprits.first() {
        Some(c) => format!("hangwatch: {} — {}", kind_text(v.kind), culprit_name(c)),
        None => format!("hangwatch: {}", kind_text(v.kind)),
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"generator\" content=\"hangwatch report\">\
         <title>{}</title><style>{STYLE}",
        Esc(&title)
    );
    let ranks: usize = rows.iter().map(|r| r.cells.len()).sum();
    let cols = rows
        .iter()
        .map(|r| r.cells.len())
        .max()
        .unwrap_or(1)
        .clamp(1, MAX_COLUMNS);
    let cell = if ranks <= BIG_CELLS_UP_TO { 40 } else { 13 };
    for (i, c) in group_colours(v).iter().enumerate() {
        let _ = write!(out, ".g{i}{{background-color:{c}}}");
    }
    let _ = write!(
        out,
        ".g-{{background-color:{NO_GROUP_COLOUR}}}:root{{--cell:{cell}px;--cols:{cols};--roww:{}px;--kind:{}}}</style></head><body><main>",
        // A flowed column holds a node name, the cells and the culprit mark.
        cols * (cell + 2) + 240,
        kind_colour(v.kind)
    );
}

fn kind_colour(kind: VerdictKind) -> &'static str {
    match kind {
        VerdictKind::BlockedInKernel | VerdictKind::Stopped | VerdictKind::Exited => "#d62728",
        VerdictKind::Diverged | VerdictKind::Busy | VerdictKind::CollectiveHang => "#e8710a",
        VerdictKind::NodeUnreachable => "#8e44ad",
        VerdictKind::Unknown => "#6b7280",
    }
}

fn culprit_name(c: &Culprit) -> String {
    let mut name = match c.rank {
        Some(rank) => format!("rank {rank}"),
        None => format!("pid {}", c.pid),
    };
    if let Some(node) = &c.node {
        name.push_str(&format!(" on {node}"));
    }
    name
}

fn header(out: &mut String, bundle: &Bundle) {
    let v = &bundle.verdict;
    let _ = write!(
        out,
        "<header class=\"verdict\"><span class=\"kind\">{}</span><h1>{}</h1><p class=\"meta\">",
        Esc(kind_text(v.kind)),
        Esc(&v.summary)
    );
    let mut meta: Vec<String> = Vec::new();
    if let Some(at) = v.observed_at_unix_s {
        meta.push(format!("observed <b>{}</b>", Esc(&time_text(at))));
    }
    if let Some(stalled) = v.stalled_for_s {
        meta.push(format!(
            "progress had stopped <b>{}</b> before",
            Esc(&duration_text(stalled))
        ));
    }
    match (&v.node, bundle.run.as_ref().and_then(|r| r.node.as_ref())) {
        (Some(node), _) | (None, Some(node)) => {
            meta.push(format!("verdict made on node <b>{}</b>", Esc(node)))
        }
        (None, None) if bundle.verdict_only() => {
            meta.push("merged verdict of the job's nodes (coordinator)".to_string())
        }
        (None, None) => {}
    }
    meta.push(format!(
        "bundle <code>{}</code>",
        Esc(&bundle.dir.display().to_string())
    ));
    out.push_str(&meta.join(" · "));
    out.push_str("</p>");
    if let Some(seen) = v.recurrence.as_ref() {
        if let Some(news) = seen.news() {
            let lead = if seen.seen_before > 0 {
                "Not the first time: "
            } else {
                ""
            };
            let _ = write!(
                out,
                "<p class=\"recurrence\">{lead}{} (<code>hangwatch history</code>).</p>",
                Esc(&news)
            );
        }
    }
    out.push_str("</header>");
}

fn todo(out: &mut String, v: &Verdict) {
    if v.recommendations.is_empty()
        && v.actions.is_empty()
        && v.warnings.is_empty()
        && v.nodes_not_seen.is_empty()
    {
        return;
    }
    out.push_str("<section class=\"todo\" id=\"todo\">");
    if !v.recommendations.is_empty() {
        out.push_str("<h2>What to do</h2><ol>");
        for r in &v.recommendations {
            let _ = write!(out, "<li>{}</li>", Esc(r));
        }
        out.push_str("</ol>");
    }
    if !v.nodes_not_seen.is_empty() {
        let _ = write!(
            out,
            "<h3>Nodes not seen</h3><p class=\"bad\">{} node(s) sent no observation; their ranks are not in this \
             verdict: {}</p>",
            v.nodes_not_seen.len(),
            Esc(&v.nodes_not_seen.join(", "))
        );
    }
    if !v.actions.is_empty() {
        out.push_str(
            "<h3>What hangwatch did</h3><table><tr><th>action</th><th>ranks</th><th>result</th><th>detail</th></tr>",
        );
        for a in &v.actions {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
                Esc(&a.action),
                Esc(&grid::rank_ranges(&a.ranks)),
                if a.ok { "ok" } else { "bad" },
                match (a.action.as_str(), a.ok) {
                    ("terminate", true) => "ended",
                    ("unkillable", _) => "could not be killed",
                    (_, true) => "ok",
                    (_, false) => "failed",
                },
                Esc(a.detail.as_deref().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    if !v.warnings.is_empty() {
        out.push_str("<h3>Warnings: what limited this verdict</h3><ul>");
        for w in &v.warnings {
            let _ = write!(out, "<li>{}</li>", Esc(w));
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
}

fn fact(out: &mut String, name: &str, value: &str) {
    let _ = write!(out, "<dt>{}</dt><dd>{}</dd>", Esc(name), Esc(value));
}

fn fact_html(out: &mut String, name: &str, html: &str) {
    let _ = write!(out, "<dt>{}</dt><dd>{html}</dd>", Esc(name));
}

fn culprit_section(out: &mut String, bundle: &Bundle, c: &Culprit, index: usize, of: usize) {
    let v = &bundle.verdict;
    let which = if of > 1 {
        format!("Culprit {} of {of}: ", index + 1)
    } else {
        "Culprit: ".to_string()
    };
    let _ = write!(
        out,
        "<section class=\"culprit-box\" id=\"culprit-{index}\"><h2>{}{} <span class=\"muted\">(pid {})</span></h2>\
         <dl class=\"facts\">",
        Esc(&which),
        Esc(&culprit_name(c)),
        c.pid
    );
    if let Some(reason) = &c.reason {
        fact(out, "why", reason);
    }
    let state = format!("{} — {}", c.state, state_text(&c.state));
    fact_html(
        out,
        "state",
        &format!(
            "<span class=\"{}\">{}</span>",
            if matches!(c.state.as_str(), "D" | "T" | "t" | "Z" | "X") {
                "bad"
            } else {
                ""
            },
            Esc(&state)
        ),
    );
    if let Some(k) = c.killable {
        fact_html(
            out,
            "killable",
            if k {
                "<span class=\"ok\">yes</span>"
            } else {
                "<span class=\"bad\">no</span> — SIGKILL cannot end it until the kernel call returns"
            },
        );
    }
    if let Some(code) = c.exit_code {
        fact(out, "exit code", &code.to_string());
    }
    if !c.where_.is_empty() {
        fact(out, "where", &c.where_);
    }
    if let Some(call) = &c.syscall {
        fact(out, "system call", &format!("{call}()"));
    }
    if let Some(wchan) = &c.wchan {
        let mut text = wchan.clone();
        if let Some(ms) = c.not_running_for_ms {
            text.push_str(&format!(
                " (not running for {})",
                duration_text(ms as f64 / 1000.0)
            ));
        }
        fact(out, "wait channel", &text);
    }
    if let Some(fault) = &c.page_fault {
        let access = match fault.access {
            hangwatch_model::FaultAccess::Read => "reading",
            hangwatch_model::FaultAccess::Write => "writing to",
        };
        fact(
            out,
            "page fault",
            &format!(
                "blocked {access} a memory-mapped file{}, in no system call",
                if fault.code {
                    " (code: the program or a shared library)"
                } else {
                    ""
                }
            ),
        );
        if c.path.is_none() && !fault.candidates.is_empty() {
            let mut html = format!("one of {}: ", fault.candidates.len());
            let shown: Vec<String> = fault
                .candidates
                .iter()
                .take(20)
                .map(|f| format!("<code>{}</code>", Esc(&f.path)))
                .collect();
            html.push_str(&shown.join(", "));
            if fault.candidates.len() > 20 {
                let _ = write!(
                    html,
                    ", ... {} more in verdict.json",
                    fault.candidates.len() - 20
                );
            }
            fact_html(out, "candidate files", &html);
        }
        if let Some(why) = &fault.unreadable {
            fact(out, "mapped files", &format!("not known: {why}"));
        }
    }
    if let Some(path) = &c.path {
        let name = if c.page_fault.is_some() {
            "memory-mapped file"
        } else {
            "file"
        };
        fact_html(out, name, &format!("<code>{}</code>", Esc(path)));
    }
    if c.mount.is_some() || c.fstype.is_some() {
        let mut html = format!("<code>{}</code>", Esc(c.mount.as_deref().unwrap_or("?")));
        if let Some(fstype) = &c.fstype {
            let _ = write!(html, " ({})", Esc(fstype));
        }
        let status = v
            .filesystems
            .iter()
            .find(|f| Some(&f.mount) == c.mount.as_ref() && (f.node.is_none() || f.node == c.node));
        match status.and_then(|f| f.responsive) {
            Some(false) => html.push_str(" <span class=\"bad\">NOT RESPONDING</span>"),
            Some(true) => html.push_str(" <span class=\"ok\">responds</span>"),
            None => {}
        }
        fact_html(out, "mount", &html);
    }
    if let Some(w) = &c.worker {
        fact(
            out,
            "stuck process",
            &format!(
                "{} — pid {}{}",
                w.role,
                w.pid,
                w.comm
                    .as_ref()
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default()
            ),
        );
    }
    if let Some(tid) = c.tid.filter(|t| *t != c.pid) {
        let thread = match &c.thread_name {
            Some(name) => format!("{name} (tid {tid})"),
            None => format!("tid {tid}"),
        };
        fact(out, "stuck thread", &thread);
    }
    if let Some(tracer) = c.tracer_pid.filter(|t| *t != 0) {
        fact(out, "tracer attached", &format!("pid {tracer}"));
    }
    if c.sigstop_pending == Some(true) {
        fact(
            out,
            "pending",
            "SIGSTOP (stops as soon as its system call returns)",
        );
    }
    if let Some(comm) = &c.comm {
        fact(out, "command", comm);
    }
    out.push_str("</dl><div class=\"cols\"><div><h3>Python stack, innermost first</h3>");
    stack(
        out,
        c.python_stack.as_deref(),
        "no Python stack (not a Python rank, or it could not be read)",
    );
    out.push_str("</div><div><h3>Kernel stack, innermost first</h3>");
    stack(
        out,
        c.kernel_stack.as_deref(),
        "no kernel stack (not readable here)",
    );
    out.push_str("</div></div>");
    if let Some(rank) = c.rank {
        let _ = write!(out, "<h3>Last output of rank {rank}</h3>");
        match bundle.output_tails.get(&rank) {
            Some(lines) if !lines.is_empty() => output_tail(out, lines),
            Some(_) => out.push_str("<p class=\"muted\">The rank printed nothing.</p>"),
            None if bundle.job_output_tail.is_some() => {
                let lines = bundle.job_output_tail.as_deref().unwrap_or_default();
                out.push_str(
                    "<p class=\"muted\">The job's output as its launcher printed it, every rank together (hangwatch \
                     watched the launcher and could not tell the lines apart by rank):</p>",
                );
                output_tail(out, lines);
            }
            None => {
                let _ = write!(
                    out,
                    "<p class=\"muted\">No <code>output/rank-{rank}.txt</code> in this bundle{}.</p>",
                    if bundle.verdict_only() || c.node.is_some() && c.node != local_node(bundle) {
                        ": the rank's output is in the bundle of its own node"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    out.push_str("</section>");
}

/// How many of a rank's last lines are shown open: the box must open on the last line, and a scrolled `<pre>`
/// opens on its first.
const OPEN_TAIL_LINES: usize = 15;

/// A rank's last output, the last line last and in view: the last [`OPEN_TAIL_LINES`] lines open, the ones
/// before them folded above.
fn output_tail(out: &mut String, lines: &[String]) {
    let split = lines.len().saturating_sub(OPEN_TAIL_LINES);
    let (earlier, last) = lines.split_at(split);
    if !earlier.is_empty() {
        let _ = write!(
            out,
            "<details><summary>{} earlier line{}</summary><pre>{}</pre></details>",
            earlier.len(),
            if earlier.len() == 1 { "" } else { "s" },
            Esc(&earlier.join("\n"))
        );
    }
    let _ = write!(out, "<pre class=\"tail\">{}</pre>", Esc(&last.join("\n")));
}

fn local_node(bundle: &Bundle) -> Option<String> {
    bundle
        .verdict
        .node
        .clone()
        .or_else(|| bundle.run.as_ref().and_then(|r| r.node.clone()))
}

fn stack(out: &mut String, frames: Option<&[String]>, none: &str) {
    match frames {
        Some(frames) if !frames.is_empty() => {
            out.push_str("<ol class=\"stack\">");
            for f in frames {
                let _ = write!(out, "<li>{}</li>", Esc(f));
            }
            out.push_str("</ol>");
        }
        _ => {
            let _ = write!(out, "<p class=\"muted\">{}</p>", Esc(none));
        }
    }
}

fn grid_section(out: &mut String, v: &Verdict, rows: &[NodeRow<'_>], ranks: usize) {
    let nodes: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter_map(|r| r.node)
        .chain(
            v.groups
                .iter()
                .flat_map(|g| g.nodes.iter().map(String::as_str)),
        )
        .collect();
    let nodes = nodes.len();
    let big = ranks <= BIG_CELLS_UP_TO;
    let _ = write!(
        out,
        "<section id=\"ranks\"><h2>Every rank: {ranks} rank{} on {nodes} node{}</h2>\
         <p class=\"muted\">One row per node, one cell per rank in local-rank order; the colour is the rank's group \
         (where it is), the letter its state. Hover a cell for its details.</p>",
        if ranks == 1 { "" } else { "s" },
        if nodes == 1 { "" } else { "s" },
    );
    if rows.is_empty() {
        out.push_str("<p class=\"muted\">The verdict names no rank.</p></section>");
        return;
    }
    let _ = write!(
        out,
        "<div class=\"grid{}{}\">",
        if big { " big" } else { "" },
        if rows.len() > FLOW_NODES_ABOVE {
            " flow"
        } else {
            ""
        }
    );
    for row in rows {
        let name = row.node.unwrap_or("node ?");
        let _ = write!(
            out,
            "<div class=\"node\" data-node=\"{}\"><span class=\"nn\" title=\"{}\">{}</span><div class=\"cells\">",
            Esc(row.node.unwrap_or("")),
            Esc(name),
            Esc(name)
        );
        let mut culprits: Vec<u32> = Vec::new();
        for cell in &row.cells {
            grid_cell(out, cell, big);
            if cell.culprit {
                culprits.push(cell.rank);
            }
        }
        out.push_str("</div>");
        if !culprits.is_empty() {
            let _ = write!(
                out,
                "<span class=\"mark\">◀ culprit: rank {}</span>",
                Esc(&grid::rank_ranges(&culprits))
            );
        }
        out.push_str("</div>");
    }
    out.push_str("</div>");
    if rows.iter().any(|r| r.node.is_none()) {
        out.push_str(
            "<p class=\"muted\">“node ?”: ranks whose node this bundle does not name (a node's bundle lists only \
             its own ranks; the coordinator's bundle has them all).</p>",
        );
    }
    legend(out, v, rows);
    out.push_str("</section>");
}

fn grid_cell(out: &mut String, cell: &Cell<'_>, big: bool) {
    let state_cls = state_class(cell.state);
    out.push_str("<i class=\"");
    match cell.group {
        Some(g) => {
            let _ = write!(out, "g{g}");
        }
        None => out.push_str("g-"),
    }
    if !state_cls.is_empty() {
        let _ = write!(out, " {state_cls}");
    }
    if cell.culprit {
        out.push_str(" culprit");
    }
    let _ = write!(out, "\" data-rank=\"{}\"", cell.rank);
    if cell.culprit {
        let _ = write!(out, " data-node=\"{}\"", Esc(cell.node.unwrap_or("")));
    }
    let mut title = format!("rank {}", cell.rank);
    if let Some(pid) = cell.pid {
        let _ = write!(title, " · pid {pid}");
    }
    if !cell.state.is_empty() {
        let _ = write!(title, " · {}", cell.state);
    }
    if !cell.where_.is_empty() {
        let _ = write!(title, " · {}", cell.where_);
    }
    if let Some(call) = cell.syscall {
        let _ = write!(title, " · {call}()");
    }
    if let Some(path) = cell.path {
        let _ = write!(title, " · {path}");
    }
    if cell.culprit {
        title.push_str(" · CULPRIT");
    }
    let _ = write!(out, " title=\"{}\">", Esc(&title));
    let letter = if state_cls.is_empty() { "" } else { cell.state };
    if big {
        let _ = write!(out, "{}<u>{}</u>", cell.rank, Esc(letter));
    } else {
        out.push_str(&escape(letter));
    }
    out.push_str("</i>");
}

fn legend(out: &mut String, v: &Verdict, rows: &[NodeRow<'_>]) {
    out.push_str("<div class=\"legend\">");
    let colours = group_colours(v);
    for (i, g) in v.groups.iter().enumerate() {
        let nodes = if g.nodes.is_empty() {
            String::new()
        } else if g.nodes.len() <= 6 {
            format!(" · on {}", g.nodes.join(", "))
        } else {
            format!(" · on {} nodes", g.nodes.len())
        };
        let _ = write!(
            out,
            "<div><span class=\"sw\" style=\"background:{}\"></span><b>{} rank{}</b> {} ({}) in <code>{}</code>: \
             rank{} {}{}</div>",
            colours[i],
            g.ranks.len(),
            if g.ranks.len() == 1 { "" } else { "s" },
            Esc(&g.state),
            state_text(&g.state),
            Esc(&g.where_),
            if g.ranks.len() == 1 { "" } else { "s" },
            Esc(&grid::rank_ranges(&g.ranks)),
            Esc(&nodes)
        );
    }
    if rows
        .iter()
        .flat_map(|r| &r.cells)
        .any(|c| c.group.is_none())
    {
        let _ = write!(
            out,
            "<div><span class=\"sw\" style=\"background:{NO_GROUP_COLOUR}\"></span>in no group of the verdict</div>"
        );
    }
    out.push_str(
        "</div><div class=\"states\"><span><span class=\"sw\" style=\"box-shadow:inset 0 0 0 3px #5a0000\">D</span>\
         uninterruptible sleep (in the kernel, cannot be killed)</span>\
         <span><span class=\"sw\" style=\"background-image:repeating-linear-gradient(45deg,rgba(0,0,0,.35) 0 2px,transparent 2px 5px)\">T</span>stopped</span>\
         <span><span class=\"sw\" style=\"opacity:.45\">Z</span>zombie / exited</span>\
         <span><span class=\"sw\">R</span>running</span>\
         <span><span class=\"sw\"></span>no letter: sleeping (waiting)</span>\
         <span><span class=\"sw\" style=\"outline:3px solid #000;outline-offset:1px;background:#e15759\"></span>culprit</span></div>",
    );
}

fn filesystems(out: &mut String, bundle: &Bundle) {
    let v = &bundle.verdict;
    out.push_str("<section id=\"filesystems\"><h2>Filesystems</h2>");
    if v.filesystems.is_empty() {
        out.push_str("<p class=\"muted\">The verdict names no filesystem.</p>");
    } else {
        out.push_str(
            "<table><tr><th>mount</th><th>type</th><th>node</th><th>status</th><th>what the probe saw</th></tr>",
        );
        for f in &v.filesystems {
            let status = match f.responsive {
                Some(false) => "<span class=\"bad\">NOT RESPONDING</span>",
                Some(true) => "<span class=\"ok\">responds</span>",
                None => "<span class=\"muted\">not probed</span>",
            };
            let _ = write!(
                out,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{status}</td><td>{}</td></tr>",
                Esc(&f.mount),
                Esc(f.fstype.as_deref().unwrap_or("")),
                Esc(f.node.as_deref().unwrap_or("")),
                Esc(f.detail.as_deref().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    match &bundle.probes {
        Some(probes) if !probes.is_empty() => {
            out.push_str(
                "<h3>Probes on this node</h3><table><tr><th>path</th><th>mount</th><th>result</th><th>took</th>\
                 <th>steps</th><th>detail</th></tr>",
            );
            for p in probes {
                let result = match p.responsive {
                    Some(false) => "<span class=\"bad\">no answer</span>",
                    Some(true) => "<span class=\"ok\">answered</span>",
                    None => "<span class=\"muted\">undetermined</span>",
                };
                let steps = p
                    .steps
                    .iter()
                    .map(|s| format!("{} {} ({} ms)", s.step, s.outcome, s.elapsed_ms))
                    .collect::<Vec<_>>()
                    .join(" → ");
                let _ = write!(
                    out,
                    "<tr><td><code>{}</code></td><td><code>{}</code> {}</td><td>{result}</td><td>{} ms</td>\
                     <td>{}</td><td>{}</td></tr>",
                    Esc(&p.path),
                    Esc(p.mount.as_deref().unwrap_or("")),
                    Esc(&p.fstype.as_deref().map(|t| format!("({t})")).unwrap_or_default()),
                    p.elapsed_ms,
                    Esc(&steps),
                    Esc(&p.detail)
                );
            }
            out.push_str("</table>");
        }
        Some(_) => out.push_str("<p class=\"muted\">No probe ran on this node.</p>"),
        None => missing_note(out, bundle, "probes.json"),
    }
    out.push_str("</section>");
}

fn missing_note(out: &mut String, bundle: &Bundle, file: &str) {
    let Some(problem) = bundle.problems.iter().find(|p| p.file == file) else {
        return;
    };
    match &problem.problem {
        Problem::Missing if bundle.verdict_only() => {
            let _ = write!(
                out,
                "<p class=\"muted\"><code>{}</code> is not in this bundle: a merged verdict; each node's report \
                 directory has its own.</p>",
                Esc(file)
            );
        }
        Problem::Missing => {
            let _ = write!(
                out,
                "<p class=\"missing\"><code>{}</code> is missing from this bundle.</p>",
                Esc(file)
            );
        }
        Problem::Unreadable(why) => {
            let _ = write!(
                out,
                "<p class=\"missing\"><code>{}</code> could not be read: {}</p>",
                Esc(file),
                Esc(why)
            );
        }
    }
}

fn kernel(out: &mut String, bundle: &Bundle) {
    out.push_str("<section id=\"kernel\"><h2>Kernel log</h2>");
    match &bundle.kernel_report {
        Some(r) => {
            let _ = write!(
                out,
                "<p><b>{}</b> <span class=\"muted\">({} line{} read)</span></p>",
                Esc(&r.summary),
                r.lines,
                if r.lines == 1 { "" } else { "s" }
            );
            if r.hung_task_reports_suppressed {
                out.push_str(
                    "<p class=\"bad\">The kernel stopped reporting hung tasks (kernel.hung_task_warnings ran out): \
                     later hangs are not in this log.</p>",
                );
            }
            if !r.hung_tasks.is_empty() {
                let _ = write!(
                    out,
                    "<h3>Hung tasks ({} report{})</h3><table><tr><th>task</th><th>reports</th><th>blocked for</th>\
                     <th>kernel stack, innermost first</th></tr>",
                    r.hung_task_reports,
                    if r.hung_task_reports == 1 { "" } else { "s" }
                );
                for t in &r.hung_tasks {
                    let _ = write!(
                        out,
                        "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                        Esc(&t.summary),
                        t.reports,
                        Esc(&duration_text(t.max_blocked_for_s as f64)),
                        Esc(&t.stack.join(" ← "))
                    );
                }
                out.push_str("</table>");
            }
            if !r.xids.is_empty() {
                out.push_str(
                    "<h3>GPU Xid errors</h3><table><tr><th>GPU</th><th>Xid</th><th>count</th><th>meaning</th>\
                     <th>first message</th></tr>",
                );
                for x in &r.xids {
                    let _ = write!(
                        out,
                        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                        Esc(&x.pci),
                        x.code,
                        x.count,
                        Esc(x.meaning.as_deref().unwrap_or("")),
                        Esc(&x.message)
                    );
                }
                out.push_str("</table>");
            }
            if !r.fs_complaints.is_empty() {
                out.push_str(
                    "<h3>Filesystem complaints</h3><table><tr><th>filesystem</th><th>what</th><th>target</th>\
                     <th>count</th><th>recovered</th><th>first message</th></tr>",
                );
                for c in &r.fs_complaints {
                    let kind = serde_json::to_value(c.kind)
                        .ok()
                        .and_then(|k| k.as_str().map(|s| s.replace('_', " ")))
                        .unwrap_or_default();
                    let _ = write!(
                        out,
                        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                        Esc(&c.filesystem_name),
                        Esc(&kind),
                        Esc(c.target.as_deref().unwrap_or("")),
                        c.count,
                        if c.recovered_at.is_some() { "yes" } else { "no" },
                        Esc(&c.message)
                    );
                }
                out.push_str("</table>");
            }
            if !r.oom_kills.is_empty() {
                out.push_str("<h3>Out-of-memory kills</h3><ul>");
                for o in &r.oom_kills {
                    let _ = write!(
                        out,
                        "<li>pid {} ({}){}</li>",
                        o.pid,
                        Esc(&o.comm),
                        if o.cgroup {
                            ", memory cgroup limit"
                        } else {
                            ""
                        }
                    );
                }
                out.push_str("</ul>");
            }
        }
        None => missing_note(out, bundle, "kernel-report.json"),
    }
    match &bundle.kernel_log_tail {
        Some(lines) if !lines.is_empty() => {
            let _ = write!(
                out,
                "<details><summary>The last {} kernel-log line{} (kernel-log.txt)</summary><pre>{}</pre></details>",
                lines.len(),
                if lines.len() == 1 { "" } else { "s" },
                Esc(&lines.join("\n"))
            );
        }
        Some(_) => out.push_str("<p class=\"muted\">kernel-log.txt is empty: nothing was logged since the job started.</p>"),
        None => missing_note(out, bundle, "kernel-log.txt"),
    }
    out.push_str("</section>");
}

fn progress(out: &mut String, bundle: &Bundle) {
    out.push_str("<section id=\"progress\"><h2>Progress up to the hang</h2>");
    match &bundle.progress {
        Some(t) => match crate::timeline::svg(t) {
            Some(svg) => {
                out.push_str(&svg);
                let mut caption = format!(
                    "{} point{} from {}",
                    t.points.len(),
                    if t.points.len() == 1 { "" } else { "s" },
                    time_text(
                        t.points
                            .first()
                            .map_or(t.started_at_unix_s, |p| p.at_unix_s)
                    )
                );
                if let Some(det) = t.stall_detected_at_unix_s {
                    let _ = write!(caption, "; stall detected {}", time_text(det));
                }
                if t.points.iter().any(|p| p.step.is_some()) {
                    caption.push_str(
                        "; line: furthest step reported, bars: units of progress (all ranks)",
                    );
                } else {
                    caption.push_str(
                        "; bars: units of progress (beats, output lines, phases), all ranks",
                    );
                }
                let _ = write!(out, "<p class=\"muted\">{}</p>", Esc(&caption));
            }
            None => out.push_str("<p class=\"muted\">progress.json has no points.</p>"),
        },
        None => missing_note(out, bundle, "progress.json"),
    }
    out.push_str("<h3>Thresholds</h3>");
    match &bundle.thresholds {
        Some(t) => {
            out.push_str("<dl class=\"facts\">");
            let secs = |s: Option<f64>| s.map(duration_text).unwrap_or_else(|| "?".to_string());
            fact(out, "hard (act)", &secs(t.hard_s));
            fact(out, "soft (roll call)", &secs(t.soft_s));
            let mut basis = t.basis.clone().unwrap_or_else(|| "?".to_string());
            if let Some(samples) = t.samples {
                let _ = write!(
                    basis,
                    ", from {samples} sample{}",
                    if samples == 1 { "" } else { "s" }
                );
            }
            fact(out, "learned how", &basis);
            if let Some(phase) = &t.phase {
                fact(out, "phase", phase);
            }
            if let Some(source) = &t.progress_source {
                fact(out, "progress seen as", source);
            }
            if let Some(stalled) = t.stalled_for_s {
                fact(out, "stalled for", &duration_text(stalled));
            }
            out.push_str("</dl>");
        }
        None => missing_note(out, bundle, "thresholds.json"),
    }
    out.push_str("</section>");
}

fn run_section(out: &mut String, bundle: &Bundle) {
    let Some(run) = &bundle.run else {
        return;
    };
    out.push_str("<section id=\"run\"><h2>The job</h2><dl class=\"facts\">");
    if !run.command.is_empty() {
        fact_html(
            out,
            "command",
            &format!("<code>{}</code>", Esc(&run.command.join(" "))),
        );
    }
    if let Some(node) = &run.node {
        fact(out, "node", node);
    }
    if let Some(n) = run.nproc {
        fact(out, "ranks started here", &n.to_string());
    }
    if let Some(s) = run.running_for_s {
        fact(out, "running for", &duration_text(s));
    }
    if let Some(version) = &run.hangwatch_version {
        fact(out, "hangwatch", version);
    }
    out.push_str("</dl></section>");
}

fn files(out: &mut String, bundle: &Bundle) {
    out.push_str("<section id=\"files\"><h2>Evidence</h2>");
    if bundle.verdict_only() {
        out.push_str(
            "<p>This bundle holds the merged verdict only (the coordinator's): the stacks, probes, kernel log and \
             output of each node are in that node's own report directory.</p>",
        );
    } else {
        let bad: Vec<_> = bundle.problems.iter().collect();
        if bad.is_empty() {
            out.push_str("<p class=\"muted\">Every file of the bundle was read.</p>");
        } else {
            out.push_str("<ul>");
            for p in bad {
                let _ = match &p.problem {
                    Problem::Missing => write!(
                        out,
                        "<li class=\"missing\"><code>{}</code>: missing</li>",
                        Esc(&p.file)
                    ),
                    Problem::Unreadable(why) => write!(
                        out,
                        "<li class=\"missing\"><code>{}</code>: unreadable: {}</li>",
                        Esc(&p.file),
                        Esc(why)
                    ),
                };
            }
            out.push_str("</ul>");
        }
    }
    if let Some(text) = &bundle.verdict_text {
        let lines: Vec<&str> = text.lines().collect();
        let shown = &lines[..lines.len().min(2000)];
        let _ = write!(
            out,
            "<details><summary>The verdict as text (verdict.txt{})</summary><pre>{}</pre></details>",
            if shown.len() < lines.len() {
                format!(", the first {} of {} lines", shown.len(), lines.len())
            } else {
                String::new()
            },
            Esc(&shown.join("\n"))
        );
    }
    out.push_str("</section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc() {
        assert_eq!(time_text(0.0), "1970-01-01 00:00:00 UTC");
    }
}
