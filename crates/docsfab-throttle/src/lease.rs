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

use crate::core::{LEASE_MS, Lease, LeaseReport, NoLease, Outcome, Settings, ThrottleState};
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
    /// The last ask found every slot this process may have taken: requests wait here, and
    /// nobody asks the store again before this.
    full_until: Option<Instant>,
    /// The last ask granted fewer slots than wanted: the lease does not ask to grow before
    /// this (it is renewed as usual when it lapses or runs out).
    grow_after: Option<Instant>,
    /// The demand a full lease last asked to grow to since the last finish here: it asks again
    /// only when more requests want a slot, and otherwise waits for a finish.
    grown_for: u32,
    /// Requests of this process waiting for one of its slots.
    waiting: u32,
    /// The demand the row records (see `RowAfter::want`).
    asked: u32,
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
    /// ran out (one store transaction). `waiting` says whether this request already waits
    /// here; it is kept up to date, so the demand this process reports counts it.
    pub(crate) fn step(
        &self,
        store: &Mutex<Store>,
        provider: &str,
        settings: &Settings,
        host_now_ms: u64,
        waiting: &mut bool,
    ) -> Step {
        let mut locals = self.locals.lock().unwrap_or_else(|p| p.into_inner());
        let local = locals.entry(provider.to_owned()).or_default();
        let step = local.step(store, provider, settings, host_now_ms, *waiting);
        match step {
            Step::Full if !*waiting => {
                local.waiting += 1;
                *waiting = true;
            }
            Step::Go { .. } | Step::Slow if *waiting => {
                local.waiting = local.waiting.saturating_sub(1);
                *waiting = false;
            }
            _ => {}
        }
        step
    }

    /// A request that waited here gave up (cancelled, or out of time).
    pub(crate) fn stop_waiting(&self, provider: &str) {
        let mut locals = self.locals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(local) = locals.get_mut(provider) {
            local.waiting = local.waiting.saturating_sub(1);
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
        local.grown_for = 0;
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
            let stale = local.row.is_some()
                && (local.written != local.in_use || local.asked > local.in_use);
            // A process with requests waiting asks again itself; its demand stays on record.
            let idle = local.waiting == 0;
            if lapsed && idle && (stale || local.report != LeaseReport::default()) {
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

/// How long a process at its fair part of the cap waits before it asks the store again.
const FULL_RETRY: Duration = Duration::from_millis(20);

impl Local {
    fn step(
        &mut self,
        store: &Mutex<Store>,
        provider: &str,
        settings: &Settings,
        host_now_ms: u64,
        counted: bool,
    ) -> Step {
        let now = Instant::now();
        // Every request of this process in flight or waiting, this one included.
        let demand =
            (self.in_use + self.waiting + u32::from(!counted)).min(settings.max_concurrent());
        if let Some(live) = self.lease.filter(|l| now < l.until && l.sends_left > 0) {
            if let Some(seq) = take(self, now) {
                return Step::Go { seq };
            }
            self.peak = self.peak.max(demand);
            // Full: ask for what this process wants (again whenever more want in), else wait
            // for a finish here.
            let may_grow = self.grow_after.is_none_or(|t| now >= t);
            if live.slots < demand && demand > self.grown_for && may_grow {
                self.grown_for = demand;
                let grown = self.renew(store, provider, settings, host_now_ms, demand);
                if let Some(seq) = grown.ok().and_then(|_| take(self, now)) {
                    return Step::Go { seq };
                }
            }
            return Step::Full;
        }
        if self.quiet_until.is_some_and(|t| now < t) {
            return Step::Slow;
        }
        if self.full_until.is_some_and(|t| now < t) {
            return Step::Full;
        }
        let want = self.peak.max(demand);
        match self.renew(store, provider, settings, host_now_ms, want) {
            Ok(()) => match take(self, now) {
                Some(seq) => Step::Go { seq },
                None => Step::Full,
            },
            Err(Some(NoLease::Full)) => Step::Full,
            Err(Some(NoLease::Paced) | None) => {
                self.quiet_until = Some(now + Duration::from_millis(LEASE_MS));
                Step::Slow
            }
        }
    }

    /// Renews the lease for `want` slots. A grant of fewer slots than wanted holds asks to grow
    /// back for `FULL_RETRY`, and none at all (the others hold their fair parts) every ask. `None`: the
    /// store could not be reached.
    fn renew(
        &mut self,
        store: &Mutex<Store>,
        provider: &str,
        settings: &Settings,
        host_now_ms: u64,
        want: u32,
    ) -> Result<(), Option<NoLease>> {
        let granted =
            renew(store, self, provider, settings, host_now_ms, Some(want)).map_err(|_| None)?;
        let again = Instant::now() + FULL_RETRY;
        match granted {
            Ok(l) if l.slots < want => self.grow_after = Some(again),
            Err(NoLease::Full) => self.full_until = Some(again),
            _ => {}
        }
        granted.map(|_| ()).map_err(Some)
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

/// Reports the lease and asks for a new one of `want` slots.
fn renew(
    store: &Mutex<Store>,
    local: &mut Local,
    provider: &str,
    settings: &Settings,
    host_now_ms: u64,
    want: Option<u32>,
) -> Result<Result<Lease, NoLease>, StoreError> {
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
    local.lease = answer.granted.ok().map(|l| Live {
        slots: l.slots,
        sends_left: l.sends,
        next_seq: l.first_seq,
        until: Instant::now() + Duration::from_millis(l.until_ms.saturating_sub(answer.now_ms)),
    });
    local.written = answer
        .granted
        .map_or(local.in_use, |l| l.slots.max(local.in_use));
    local.asked = match answer.granted {
        Ok(_) | Err(NoLease::Full) => want.unwrap_or(0).max(local.written),
        Err(NoLease::Paced) => local.written,
    };
    if answer.row.is_none() {
        (local.written, local.asked) = (0, 0);
    }
    Ok(answer.granted)
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
    local.asked = local.written;
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
