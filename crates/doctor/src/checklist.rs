//! The doctor's checklist for people: findings grouped by severity, worst first, each problem with why and fix;
//! Unicode marks where the locale says UTF-8, ASCII otherwise.

use crate::{Finding, HostFacts, Severity};

/// The marks of the checklist: Unicode where the locale says UTF-8, ASCII otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Glyphs {
    pass: &'static str,
    problem: &'static str,
    advice: &'static str,
}

impl Glyphs {
    /// The marks for this process's locale (`LC_ALL`, `LC_CTYPE`, `LANG`).
    pub fn for_locale() -> Self {
        let utf8 = ["LC_ALL", "LC_CTYPE", "LANG"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
            .is_some_and(|v| {
                let v = v.to_ascii_lowercase();
                v.contains("utf-8") || v.contains("utf8")
            });
        if utf8 {
            Glyphs {
                pass: "✓",
                problem: "✗",
                advice: "!",
            }
        } else {
            Glyphs {
                pass: "ok",
                problem: "XX",
                advice: "!!",
            }
        }
    }
}

/// The human checklist: grouped by severity, worst first; problems first within a group, each with why and fix.
pub fn checklist(findings: &[Finding], facts: &HostFacts, glyphs: Glyphs) -> String {
    let count = |s: Severity| findings.iter().filter(|f| !f.ok && f.severity == s).count();
    let (blind, silent, advice) = (
        count(Severity::Blind),
        count(Severity::Silent),
        count(Severity::Advice),
    );
    let who = match facts.euid {
        Some(0) => "root".to_string(),
        Some(uid) => format!("uid {uid}"),
        None => "uid unknown".to_string(),
    };
    let mut out = format!(
        "hangwatch doctor ({who}): {blind} would make hangwatch blind, {silent} would leave a hang silent, {advice} advice\n"
    );
    for severity in [Severity::Blind, Severity::Silent, Severity::Advice] {
        let mut group: Vec<&Finding> = findings.iter().filter(|f| f.severity == severity).collect();
        if group.is_empty() {
            continue;
        }
        group.sort_by_key(|f| f.ok);
        out.push_str(&format!("\n{}:\n", severity.heading()));
        for f in group {
            let mark = match (f.ok, f.severity) {
                (true, _) => glyphs.pass,
                (false, Severity::Advice) => glyphs.advice,
                (false, _) => glyphs.problem,
            };
            out.push_str(&format!("  {mark} {}: {}\n", check_name(f), f.what));
            if let Some(fix) = &f.fix {
                out.push_str(&format!("      why: {}\n      fix: {fix}\n", f.why));
            }
        }
    }
    if blind + silent == 0 {
        out.push_str("\nNothing here would make hangwatch blind or a hang silent.\n");
    }
    out.truncate(out.trim_end().len());
    out
}

fn check_name(finding: &Finding) -> String {
    serde_json::to_value(finding.check)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", finding.check))
}
