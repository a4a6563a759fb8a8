//! Whether the process that took a permit is still alive, so a permit of a process killed with
//! `kill -9` is given back instead of holding a slot for ever.
//!
//! A process is named by its id and its start time in clock ticks since boot (field 22 of
//! `/proc/PID/stat`), so a reused process id does not keep a dead holder's permits alive. The
//! run store asks the same question about a run's owner, with this same type, so there is one
//! liveness test in docsfab.

/// A process, as a permit's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub start_ticks: Option<u64>,
}

impl Holder {
    /// This process.
    pub fn current() -> Holder {
        Holder::of(std::process::id())
    }

    /// The process with id `pid` as it is now (its start time read from `/proc` where there is
    /// one).
    pub fn of(pid: u32) -> Holder {
        Holder {
            pid,
            start_ticks: read_stat(pid).and_then(|s| s.start_ticks),
        }
    }

    /// Whether the holder still runs. A zombie counts as gone. Without `/proc` (not Linux) only
    /// the process id can be asked about, with signal 0.
    pub fn is_alive(&self) -> bool {
        if !proc_available() {
            return pid_exists(self.pid);
        }
        let Some(stat) = read_stat(self.pid) else {
            return false;
        };
        if stat.state == 'Z' || stat.state == 'X' {
            return false;
        }
        match self.start_ticks {
            Some(ticks) => stat.start_ticks == Some(ticks),
            None => true,
        }
    }
}

struct ProcStat {
    state: char,
    start_ticks: Option<u64>,
}

fn proc_available() -> bool {
    std::path::Path::new("/proc/self/stat").exists()
}

fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only asks whether the process exists; nothing is delivered.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn read_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// The command name (field 2) may hold spaces and parentheses, so fields are counted from the
/// last `)`: state is field 3, starttime field 22.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start_ticks = fields.nth(18).and_then(|f| f.parse().ok());
    Some(ProcStat { state, start_ticks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = Holder::current();
        assert!(me.is_alive());
        let reused = Holder {
            pid: me.pid,
            start_ticks: me.start_ticks.map(|t| t + 1),
        };
        if me.start_ticks.is_some() {
            assert!(!reused.is_alive());
        }
    }

    #[test]
    fn a_command_name_with_parentheses_is_skipped() {
        let stat =
            parse_stat("42 (a) b) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 0").unwrap();
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.start_ticks, Some(777));
    }
}
