//! The fast path: a process admits requests from a lease of the shared budget instead of
//! deciding each one in the store.
//!
//! While a provider is unpaced (no hold, every mirrored bucket at least half full, the probe
//! window open), the store grants this process a lease: up to `slots` requests in flight at
//! once and `sends` in all, for `LEASE_MS`. Admitting and finishing under it is a counter
//! behind a mutex. The store is touched to renew the lease, to report a refusal or a head
//! that leaves a bucket under half (either ends the lease at once), and by a settler thread
//! that shrinks the lease row to what is still in flight once the lease lapsed.
//!
//! The shared guarantees hold: the lease row counts its slots against the one cap (so other
//! processes never see more free than there is), a lease is never granted to jump the queue
//! of waiters, a kill -9 leaves a row the next decision reclaims like any permit, and a hold
//! or pacing set by another process reaches this one when its lease lapses, within `LEASE_MS`.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use crate::core::{LEASE_MS, LeaseReport, Outcome, Settings, ThrottleState};
use crate::headers::{RateHeaders, unix_ms};
use crate::store::{LeaseTx, Store, StoreError};

/// A lease this process holds for one provider.
#[derive(Debug, Clone, Copy)]
struct Live {
    slots: u32,
    sends_left: u32,
    next_seq: u64,
    until: Instant,
}

/// One provider's lease state in this process.
#[derive(Debug, Default)]
struct Local {
    /// The lease row in the store, and the slots it was last written with.
    row: Option<i64>,
    written: u32,
    lease: Option<Live>,
    /// Requests sent under a lease and not finished yet.
    in_use: u32,
    report: LeaseReport,
    /// The most requests wanted at once since the lease was granted.
    peak: u32,
    /// No lease is asked for before this (the last ask was refused: the provider is paced).
    quiet_until: Option<Instant>,
    /// A full lease asked once to grow since the last finish here: it waits for one now.
    grow_asked: bool,
}

/// What the fast path says to a request.
pub(crate) enum Step {
    /// Send under the lease, as `seq`.
    Go { seq: u64 },
    /// The lease's slots are all in use: wait for a finish in this process.
    Full,
    /// No lease: decide in the store.
    Slow,
}

/// The leases of one process, per provider.
#[derive(Default)]
pub(crate) struct Leases {
    locals: Mutex<HashMap<String, Local>>,
}

impl Leases {
    /// Admits from the lease when there is one to admit from, renewing it when it lapsed or
    /// ran out (one store transaction).
    pub(crate) fn step(
        &self,
        store: &Mutex<Store>,
        provider: &str,
        settings: &Settings,
        host_now_ms: u64,
    ) -> Step {
        let mut locals = self.locals.lock().unwrap_or_else(|p| p.into_inner());
        let local = locals.entry(provider.to_owned()).or_default();
        let now = Instant::now();
        if let Some(live) = local.lease.filter(|l| now < l.until && l.sends_left > 0) {
            if let Some(seq) = take(local, now) {
                return Step::Go { seq };
            }
            local.peak = local.peak.max(local.in_use + 1);
            // Full: ask once for every free slot (the store leaves other processes' waiters
            // theirs), then wait for a finish here.
            if live.slots < settings.max_concurrent() && !local.grow_asked {
                local.grow_asked = true;
                let want = Some(settings.max_concurrent());
                if let Ok(true) = renew(store, local, provider, settings, host_now_ms, want)
                    && let Some(seq) = take(local, now)
                {
                    return Step::Go { seq };
                }
            }
            return Step::Full;
        }
        if local.quiet_until.is_some_and(|t| now < t) {
            return Step::Slow;
        }
        let want = local.peak.max(local.in_use + 1);
        match renew(store, local, provider, settings, host_now_ms, Some(want)) {
            Ok(true) => match take(local, now) {
                Some(seq) => Step::Go { seq },
                None => Step::Full,
            },
            Ok(false) | Err(_) => {
                local.quiet_until = Some(now + Duration::from_millis(LEASE_MS));
                Step::Slow
            }
        }
    }

    /// A request sent under a lease ended. Only a refusal, or a head that leaves a bucket under
    /// half, reaches the store at once (and ends the lease); the rest is counted here and
    /// reported at the next renewal.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish(
        &self,
        store: &Mutex<Store>,
        provider: &str,
        settings: &Settings,
        seq: u64,
        prompt_tokens: u64,
        outcome: Outcome,
        headers: &RateHeaders,
        host_now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut locals = self.locals.lock().unwrap_or_else(|p| p.into_inner());
        let local = locals.entry(provider.to_owned()).or_default();
        local.in_use = local.in_use.saturating_sub(1);
        local.grow_asked = false;
        if let Outcome::Success {
            input_tokens,
            output_tokens,
        } = outcome
        {
            local.report.answered = local.report.answered.saturating_add(1);
            if let Some(input) = input_tokens {
                local.report.prompt_tokens += prompt_tokens;
                local.report.input_tokens += input;
            }
            local.report.output_tokens += output_tokens.unwrap_or(0);
        }
        let newer = local
            .report
            .newest_head
            .as_ref()
            .is_none_or(|(s, _)| *s < seq);
        if !headers.observations.is_empty() && newer {
            local.report.newest_head = Some((seq, headers.clone()));
        }
        let refused = outcome == Outcome::RateLimited;
        let lapsed = local.lease.is_none_or(|l| Instant::now() >= l.until);
        if refused || !ThrottleState::head_is_ample(headers) || lapsed {
            let finished = refused.then_some((seq, outcome, headers));
            settle(store, local, provider, settings, host_now_ms, finished)?;
            if refused {
                local.quiet_until = Some(Instant::now() + Duration::from_millis(LEASE_MS));
            }
        }
        Ok(())
    }

    /// A request decided in the store ended well, far from the provider's limits: the next
    /// request may ask for a lease at once.
    pub(crate) fn worth_asking(&self, provider: &str) {
        let mut locals = self.locals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(local) = locals.get_mut(provider) {
            local.quiet_until = None;
        }
    }

    /// Shrinks every lapsed lease's row to what is still in flight under it (the settler's
    /// round). A store error leaves the row as it is, which only counts too much, and is
    /// tried again at the next round.
    fn settle_lapsed(
        &self,
        store: &Mutex<Store>,
        settings: &HashMap<String, Settings>,
        now_ms: u64,
    ) {
        let mut locals = self.locals.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        for (provider, local) in locals.iter_mut() {
            let lapsed = local.lease.is_none_or(|l| now >= l.until);
            let stale = local.row.is_some() && local.written != local.in_use;
            if lapsed && (stale || local.report != LeaseReport::default()) {
                let s = settings.get(provider).copied().unwrap_or_default();
                let _ = settle(store, local, provider, &s, now_ms, None);
            }
        }
    }
}

impl Leases {
    /// Hands every lease back (the throttle is going away): its rows stop counting. Every
    /// permit holds the throttle, so nothing is in flight under them any more.
    pub(crate) fn hand_back(
        &self,
        store: &Mutex<Store>,
        settings: &HashMap<String, Settings>,
        now_ms: u64,
    ) {
        let mut locals = self.locals.lock().unwrap_or_else(|p| p.into_inner());
        for (provider, local) in locals.iter_mut() {
            if local.row.is_some() {
                let s = settings.get(provider).copied().unwrap_or_default();
                // A row that cannot be handed back is reclaimed when this process ends.
                let _ = settle(store, local, provider, &s, now_ms, None);
            }
        }
    }
}

/// Takes one send from the live lease.
fn take(local: &mut Local, now: Instant) -> Option<u64> {
    let live = local
        .lease
        .as_mut()
        .filter(|l| now < l.until && l.sends_left > 0 && local.in_use < l.slots)?;
    live.sends_left -= 1;
    let seq = live.next_seq;
    live.next_seq += 1;
    local.in_use += 1;
    local.peak = local.peak.max(local.in_use);
    Some(seq)
}

/// Reports the lease and asks for a new one of `want` slots; true when one was granted.
fn renew(
    store: &Mutex<Store>,
    local: &mut Local,
    provider: &str,
    settings: &Settings,
    host_now_ms: u64,
    want: Option<u32>,
) -> Result<bool, StoreError> {
    let mut report = std::mem::take(&mut local.report);
    report.unused = local.lease.map_or(0, |l| l.sends_left);
    let tx = LeaseTx {
        row: local.row,
        keep: local.in_use,
        report: &report,
        finished: None,
        want,
    };
    let answer = store.lock().unwrap_or_else(|p| p.into_inner()).lease_tx(
        provider,
        settings,
        host_now_ms,
        &tx,
    );
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            // Not reported: keep it for the next transaction.
            report.unused = 0;
            local.report = report;
            return Err(e);
        }
    };
    local.row = answer.row;
    local.peak = 0;
    local.lease = answer.granted.map(|l| Live {
        slots: l.slots,
        sends_left: l.sends,
        next_seq: l.first_seq,
        until: Instant::now() + Duration::from_millis(l.until_ms.saturating_sub(answer.now_ms)),
    });
    local.written = answer
        .granted
        .map_or(local.in_use, |l| l.slots.max(local.in_use));
    if answer.row.is_none() {
        local.written = 0;
    }
    Ok(local.lease.is_some())
}

/// Hands the lease back (reporting `finished` with it) and leaves the row counting what is
/// still in flight.
fn settle(
    store: &Mutex<Store>,
    local: &mut Local,
    provider: &str,
    settings: &Settings,
    host_now_ms: u64,
    finished: Option<(u64, Outcome, &RateHeaders)>,
) -> Result<(), StoreError> {
    let mut report = std::mem::take(&mut local.report);
    report.unused = local.lease.take().map_or(0, |l| l.sends_left);
    let tx = LeaseTx {
        row: local.row,
        keep: local.in_use,
        report: &report,
        finished,
        want: None,
    };
    let answer = store.lock().unwrap_or_else(|p| p.into_inner()).lease_tx(
        provider,
        settings,
        host_now_ms,
        &tx,
    )?;
    local.row = answer.row;
    local.written = if answer.row.is_some() {
        local.in_use
    } else {
        0
    };
    Ok(())
}

/// Starts the thread that settles lapsed leases every half lease, for as long as the
/// throttle it serves exists.
pub(crate) fn spawn_settler(
    leases: Weak<Leases>,
    store: Weak<Mutex<Store>>,
    settings: HashMap<String, Settings>,
) {
    let spawned = std::thread::Builder::new()
        .name("docsfab-throttle-leases".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(LEASE_MS / 2));
                let (Some(leases), Some(store)) = (leases.upgrade(), store.upgrade()) else {
                    return;
                };
                let now_ms = unix_ms(std::time::SystemTime::now());
                leases.settle_lapsed(&store, &settings, now_ms);
            }
        });
    // Without the thread a lapsed lease's row counts until this process's next decision or
    // its end: too much, never too little.
    drop(spawned);
}
