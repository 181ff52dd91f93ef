//! The picture of every rank, as data: one row per node, one cell per rank at its local rank (its position among
//! that node's ranks sorted by rank number), each with its group and state. Pure: verdict in, rows out.

use std::collections::BTreeMap;

use hangwatch_model::Verdict;

/// One rank of the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell<'a> {
    pub rank: u32,
    pub node: Option<&'a str>,
    pub pid: Option<i32>,
    /// State letter as `ps` shows it; empty when unknown.
    pub state: &'a str,
    /// Index into `verdict.groups`; `None` for a rank in no group.
    pub group: Option<usize>,
    pub culprit: bool,
    pub where_: &'a str,
    pub syscall: Option<&'a str>,
    pub path: Option<&'a str>,
}

/// One node's ranks, local rank 0 first.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow<'a> {
    /// `None`: ranks whose node the bundle does not say (a node's own bundle names only its ranks' nodes).
    pub node: Option<&'a str>,
    pub cells: Vec<Cell<'a>>,
}

/// The grid of `verdict`: nodes in the order of their lowest rank, ranks of an unknown node last.
pub fn layout(verdict: &Verdict) -> Vec<NodeRow<'_>> {
    let mut cells: BTreeMap<u32, Cell<'_>> = BTreeMap::new();
    for line in &verdict.ranks {
        let Some(rank) = line.rank else { continue };
        cells.insert(
            rank,
            Cell {
                rank,
                node: line.node.as_deref(),
                pid: Some(line.pid),
                state: &line.state,
                group: None,
                culprit: false,
                where_: &line.where_,
                syscall: line.syscall.as_deref(),
                path: line.path.as_deref(),
            },
        );
    }
    for culprit in &verdict.culprits {
        let Some(rank) = culprit.rank else { continue };
        // The rank's own line, not the worker's, when a worker is the culprit.
        let cell = cells.entry(rank).or_insert_with(|| Cell {
            rank,
            node: culprit.node.as_deref(),
            pid: Some(culprit.worker.as_ref().map_or(culprit.pid, |w| w.rank_pid)),
            state: &culprit.state,
            group: None,
            culprit: false,
            where_: &culprit.where_,
            syscall: culprit.syscall.as_deref(),
            path: culprit.path.as_deref(),
        });
        cell.culprit = true;
        if cell.node.is_none() {
            cell.node = culprit.node.as_deref();
        }
    }
    for (index, group) in verdict.groups.iter().enumerate() {
        let only_node = match group.nodes.as_slice() {
            [node] => Some(node.as_str()),
            _ => None,
        };
        for &rank in &group.ranks {
            let cell = cells.entry(rank).or_insert_with(|| Cell {
                rank,
                node: only_node,
                pid: None,
                state: &group.state,
                group: None,
                culprit: false,
                where_: &group.where_,
                syscall: None,
                path: None,
            });
            cell.group.get_or_insert(index);
            if cell.node.is_none() {
                cell.node = only_node;
            }
        }
    }

    let mut by_node: BTreeMap<Option<&str>, Vec<Cell<'_>>> = BTreeMap::new();
    for cell in cells.into_values() {
        by_node.entry(cell.node).or_default().push(cell);
    }
    let mut rows: Vec<NodeRow<'_>> = by_node
        .into_iter()
        .map(|(node, cells)| NodeRow { node, cells })
        .collect();
    // Cells are in rank order already (from the BTreeMap), so a row's first cell is its lowest rank.
    rows.sort_by_key(|row| (row.node.is_none(), row.cells.first().map(|c| c.rank)));
    rows
}

pub use hangwatch_model::rank_ranges;

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::{Group, RankPlace, RankReport};

    fn line(rank: u32, node: &str, state: &str) -> RankReport {
        RankReport {
            at: RankPlace {
                rank: Some(rank),
                node: Some(node.into()),
                pid: 1000 + rank as i32,
                state: state.into(),
                ..RankPlace::default()
            },
            cpu_ms_during_sample: None,
            threads: Vec::new(),
            threads_folded: 0,
            workers: Vec::new(),
        }
    }

    #[test]
    fn nodes_are_rows_in_order_of_their_lowest_rank_and_local_rank_is_the_position() {
        let mut v = Verdict::unknown("x");
        v.ranks = vec![
            line(9, "b", "S"),
            line(8, "b", "S"),
            line(1, "a", "S"),
            line(0, "a", "D"),
        ];
        v.groups = vec![Group {
            where_: "w".into(),
            state: "S".into(),
            ranks: vec![1, 8, 9],
            pids: Vec::new(),
            nodes: vec!["a".into(), "b".into()],
        }];
        let rows = layout(&v);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].node, Some("a"));
        assert_eq!(
            rows[0].cells.iter().map(|c| c.rank).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(rows[1].node, Some("b"));
        assert_eq!(
            rows[1].cells.iter().map(|c| c.rank).collect::<Vec<_>>(),
            [8, 9]
        );
        assert_eq!(rows[0].cells[0].group, None);
        assert_eq!(rows[1].cells[0].group, Some(0));
    }

    #[test]
    fn ranks_known_only_from_groups_take_a_single_node_or_go_to_the_unknown_row() {
        let mut v = Verdict::unknown("x");
        v.groups = vec![
            Group {
                where_: "barrier".into(),
                state: "S".into(),
                ranks: vec![1, 2],
                pids: Vec::new(),
                nodes: vec!["n2".into(), "n3".into()],
            },
            Group {
                where_: "write".into(),
                state: "D".into(),
                ranks: vec![0],
                pids: Vec::new(),
                nodes: vec!["n1".into()],
            },
        ];
        let rows = layout(&v);
        assert_eq!(rows[0].node, Some("n1"));
        assert_eq!(rows[0].cells[0].state, "D");
        assert_eq!(rows[1].node, None);
        assert_eq!(rows[1].cells.len(), 2);
    }
}
