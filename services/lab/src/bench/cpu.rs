//! Where the machine's CPU went during a scenario: PostgreSQL's processes, the palisade process
//! (the five services, the in-process workers and the benchmark's own client), NATS, everything
//! else, and idle. Read from `/proc` before and after (Linux; elsewhere nothing is reported):
//! each process's user and system time, plus, for PostgreSQL, the time of backends that exited
//! in between (counted to the postmaster once it reaped them), against the whole machine's.

/// Shares of the whole machine (all cores together: the five add up to about 100 %).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSplit {
    pub postgresql: f64,
    pub palisade: f64,
    pub nats: f64,
    pub other: f64,
    pub idle: f64,
}

impl CpuSplit {
    /// `PostgreSQL 55 %, palisade 23 %, NATS 16 %, other 3 %, idle 3 %`.
    pub fn line(&self) -> String {
        format!(
            "PostgreSQL {:.0} %, palisade {:.0} %, NATS {:.0} %, other {:.0} %, idle {:.0} %",
            self.postgresql, self.palisade, self.nats, self.other, self.idle
        )
    }

    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "postgresql_percent": super::round(self.postgresql),
            "palisade_percent": super::round(self.palisade),
            "nats_percent": super::round(self.nats),
            "other_percent": super::round(self.other),
            "idle_percent": super::round(self.idle),
        })
    }
}

/// Cumulative CPU time in clock ticks at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    postgresql: u64,
    palisade: u64,
    nats: u64,
    /// The machine's busy and idle time, every core summed.
    busy: u64,
    idle: u64,
}

/// Reads every process's CPU time and the machine's; `None` where `/proc` cannot be read.
#[cfg(target_os = "linux")]
pub fn sample() -> Option<Sample> {
    use procfs::CurrentSI as _;
    let own = i32::try_from(std::process::id()).ok()?;
    let mut sample = Sample::default();
    for process in procfs::process::all_processes().ok()? {
        // A process may end between the listing and the read.
        let Ok(stat) = process.and_then(|process| process.stat()) else {
            continue;
        };
        let spent = stat.utime + stat.stime;
        let reaped = u64::try_from(stat.cutime + stat.cstime).unwrap_or(0);
        if stat.pid == own {
            sample.palisade += spent;
        } else if stat.comm == "postgres" {
            sample.postgresql += spent + reaped;
        } else if stat.comm == "nats-server" {
            sample.nats += spent;
        }
    }
    let total = procfs::KernelStats::current().ok()?.total;
    sample.idle = total.idle + total.iowait.unwrap_or(0);
    sample.busy = total.user
        + total.nice
        + total.system
        + total.irq.unwrap_or(0)
        + total.softirq.unwrap_or(0)
        + total.steal.unwrap_or(0);
    Some(sample)
}

#[cfg(not(target_os = "linux"))]
pub fn sample() -> Option<Sample> {
    None
}

/// The split of the machine's time between two samples.
pub fn split(before: &Sample, after: &Sample) -> Option<CpuSplit> {
    let spent = |before: u64, after: u64| after.saturating_sub(before) as f64;
    let busy = spent(before.busy, after.busy);
    let machine = busy + spent(before.idle, after.idle);
    if machine <= 0.0 {
        return None;
    }
    let share = |ticks: f64| ticks * 100.0 / machine;
    let postgresql = spent(before.postgresql, after.postgresql);
    let palisade = spent(before.palisade, after.palisade);
    let nats = spent(before.nats, after.nats);
    Some(CpuSplit {
        postgresql: share(postgresql),
        palisade: share(palisade),
        nats: share(nats),
        other: share((busy - postgresql - palisade - nats).max(0.0)),
        idle: share(machine - busy),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_are_of_the_whole_machine() {
        let before = Sample::default();
        let after = Sample {
            postgresql: 100,
            palisade: 50,
            nats: 30,
            busy: 190,
            idle: 10,
        };
        let split = split(&before, &after).expect("time passed");
        assert_eq!(
            (
                split.postgresql,
                split.palisade,
                split.nats,
                split.other,
                split.idle
            ),
            (50.0, 25.0, 15.0, 5.0, 5.0)
        );
        assert_eq!(super::split(&after, &after), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_counted_as_palisade() {
        let before = sample().expect("/proc is readable");
        let started = std::time::Instant::now();
        let mut spin = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(200) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let after = sample().expect("/proc is readable");
        let split = split(&before, &after).expect("time passed");
        assert!(split.palisade > 0.0, "{split:?}");
    }
}
