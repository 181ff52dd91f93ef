//! The Prometheus text exposition format (0.0.4) from `prometheus-client`'s OpenMetrics text: what Prometheus,
//! node_exporter's textfile collector and every Prometheus text parser read.
//!
//! The two differ in two ways for the metric types hangwatch uses (gauges and counters): OpenMetrics names a
//! counter's family without its `_total` suffix in `# HELP`/`# TYPE` (0.0.4 parsers then see an untyped
//! `..._total` sample and a counter without samples), and ends with `# EOF`.

use prometheus_client::registry::Registry;

/// The `Content-Type` of `encode`'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `registry` in the Prometheus text format.
pub(crate) fn encode(registry: &Registry) -> String {
    let mut open_metrics = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode_registry(&mut open_metrics, registry)
    {
        // Only a label value that fails to encode does this; ours are enums and numbers.
        tracing::warn!(error = %e, "cannot encode the metrics");
    }
    to_prometheus_text(&open_metrics)
}

/// Rewrites OpenMetrics text (gauges and counters, no `# EOF`) into the Prometheus text format.
pub(crate) fn to_prometheus_text(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len() + 64);
    let lines: Vec<&str> = open_metrics.lines().collect();
    let mut i = 0;
    while let Some(line) = lines.get(i) {
        i += 1;
        if *line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        // A family's descriptor is `# HELP name text` then `# TYPE name type`.
        if let (Some(help), Some(ty)) = (line.strip_prefix("# HELP "), lines.get(i)) {
            let name = help.split(' ').next().unwrap_or_default();
            if *ty == format!("# TYPE {name} counter") {
                let text = help.strip_prefix(name).unwrap_or_default();
                out.push_str(&format!(
                    "# HELP {name}_total{text}\n# TYPE {name}_total counter\n"
                ));
                i += 1;
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_with_their_total_suffix_and_eof_goes() {
        let om = "# HELP a_verdicts Verdicts.\n# TYPE a_verdicts counter\na_verdicts_total{kind=\"busy\"} 1\n\
                  # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP a_verdicts_total Verdicts.\n# TYPE a_verdicts_total counter\na_verdicts_total{kind=\"busy\"} 1\n\
             # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n"
        );
    }
}
