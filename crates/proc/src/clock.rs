//! Clock ticks per second: the unit of the CPU times in `stat` files.

/// What Linux uses on every common architecture; the fallback when `sysconf` does not answer.
pub const DEFAULT_CLK_TCK: u64 = 100;

/// `sysconf(_SC_CLK_TCK)` of this machine.
pub fn clk_tck() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => u64::try_from(ticks).unwrap_or(DEFAULT_CLK_TCK),
        _ => DEFAULT_CLK_TCK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_answers_a_plausible_value() {
        let ticks = clk_tck();
        assert!((10..=10_000).contains(&ticks), "clk_tck = {ticks}");
    }
}
