//! Rank lists as people read them: `0-3, 5, 7-9`, `rank 3`, `ranks 0-2`.

use std::collections::BTreeSet;

/// Compresses ranks (in any order, repeats allowed) into sorted runs: `0-3, 5, 7-9`; empty for none.
pub fn rank_ranges(ranks: &[u32]) -> String {
    let sorted: BTreeSet<u32> = ranks.iter().copied().collect();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for r in sorted {
        match runs.last_mut() {
            Some((_, end)) if r == *end + 1 => *end = r,
            _ => runs.push((r, r)),
        }
    }
    runs.iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `rank 3`, `ranks 0-2, 5`; empty for none.
pub fn ranks_words(ranks: &[u32]) -> String {
    match ranks {
        [] => String::new(),
        [one] => format!("rank {one}"),
        many => format!("ranks {}", rank_ranges(many)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_compressed_in_rank_order() {
        assert_eq!(rank_ranges(&[1, 2, 3, 5, 7, 8, 9]), "1-3, 5, 7-9");
        assert_eq!(rank_ranges(&[3, 0, 1, 2, 7, 9, 10]), "0-3, 7, 9-10");
        assert_eq!(rank_ranges(&[4]), "4");
        assert_eq!(rank_ranges(&[3, 1, 2, 2]), "1-3");
        assert_eq!(rank_ranges(&[]), "");
        assert_eq!(rank_ranges(&[u32::MAX, 0]), format!("0, {}", u32::MAX));
    }

    #[test]
    fn one_rank_or_several_in_words() {
        assert_eq!(ranks_words(&[3]), "rank 3");
        assert_eq!(ranks_words(&[2, 0, 1, 5]), "ranks 0-2, 5");
        assert_eq!(ranks_words(&[]), "");
    }
}
