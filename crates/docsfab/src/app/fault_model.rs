//! The fault model fitted from the runs a store recorded: what `sim goodput --fault-model
//! store` simulates against, and the expected step success `doctor` reports.

use std::collections::BTreeMap;

use docsfab_goodput::model::{FaultModel, Observed};
use docsfab_goodput::policy::{DocsfabPolicy, Policy};
use docsfab_goodput::report::simulate;
use docsfab_record::RunRecord;
use docsfab_runtime::stats::{Filter, Stats};
use docsfab_runtime::store::{RunStore, StoreUrl};

use crate::app::error::CliError;
use crate::app::home::HostContext;

/// The fitted model (when the store holds enough runs) and the number of runs read.
pub fn fit_store(path: &StoreUrl) -> Result<(Option<FaultModel>, u64), CliError> {
    let filter = Filter::default();
    Ok(fit(
        &crate::app::store::load_records(path, &filter)?,
        &filter,
    ))
}

/// The fitted model of `records` (when there are enough runs) and the number of runs.
pub fn fit(records: &[RunRecord], filter: &Filter) -> (Option<FaultModel>, u64) {
    let stats = Stats::from_records(records, filter);
    let fitted = (stats.runs >= MIN_RUNS)
        .then(|| FaultModel::fit(&observed(&stats)))
        .flatten();
    (fitted, stats.runs)
}

/// `doctor`'s line: the expected step success of this host's policy under the model fitted
/// from the store doctor opened at `path`; `None` until the store holds enough runs (or cannot
/// be read: doctor reports the store elsewhere, and this line is advice).
pub fn doctor_line(
    ctx: &HostContext,
    store: &RunStore,
    path: &StoreUrl,
    attempt_timer_ms: u64,
) -> Option<String> {
    let filter = Filter::default();
    let records = crate::app::store::records_of(store, path, &filter).ok()?;
    let (Some(model), runs) = fit(&records, &filter) else {
        return None;
    };
    let p = DocsfabPolicy::from_limits(&ctx.limits, ctx.rules.clone(), attempt_timer_ms);
    let s = simulate(
        "effective",
        &Policy::Docsfab(Box::new(p)),
        &model,
        DOCTOR_STEPS,
        1,
    );
    Some(format!(
        "Expected step success: {:.2}% (95% CI {:.2}%..{:.2}%) under the fault model fitted from {runs} recorded runs; details: docsfab sim goodput --fault-model store",
        s.success_rate * 100.0,
        s.success_ci95.low * 100.0,
        s.success_ci95.high * 100.0
    ))
}

/// Enough steps for a two-decimal figure, few enough to keep `doctor` instant.
const DOCTOR_STEPS: u64 = 20_000;

/// The store's figures in the fit's terms; wait buckets start at their lower edge.
fn observed(s: &Stats) -> Observed {
    let mut bursts: BTreeMap<u32, u64> = s.fault_bursts.before_success.clone();
    for (len, n) in &s.fault_bursts.before_give_up {
        *bursts.entry(*len).or_default() += n;
    }
    let floor = |label: &str| match label {
        "1-5s" => 1_000,
        "5-20s" => 5_000,
        ">=20s" => 20_000,
        _ => 0,
    };
    Observed {
        requests: s.requests,
        bursts: bursts.into_iter().collect(),
        faults_by_class: s.replays.by_class.clone().into_iter().collect(),
        repeats_after_429: s
            .rate_limit_repeats
            .iter()
            .map(|b| (floor(b.wait), b.probability))
            .collect(),
    }
}

/// Runs the store must hold before a fit means anything.
pub const MIN_RUNS: u64 = 3;
