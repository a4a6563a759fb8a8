//! `docsfab sim goodput`: the Monte Carlo of docsfab's retry policy and the peers' defaults
//! against a fault model (docs/budgets.md). The simulation itself is `docsfab-goodput`.

use std::collections::BTreeMap;
use std::path::Path;

use clap::Args;
use docsfab_goodput::model::{FaultModel, Observed};
use docsfab_goodput::policy::{DocsfabPolicy, PEERS, Policy, peer};
use docsfab_goodput::report::{Summary, simulate};
use docsfab_runtime::composition::DEFAULT_TIMEOUT_MS;
use docsfab_runtime::stats::{Filter, Stats};

use crate::error::{CliError, emit, plain_reason};
use crate::home::HostContext;

#[derive(Debug, Args)]
pub struct GoodputArgs {
    /// `seed` (the spec's published figures), `store` (fitted from recorded runs), or a YAML FILE.
    #[arg(long, value_name = "seed|store|FILE", default_value = "seed")]
    pub fault_model: String,
    /// `effective` (this host's resolved limits), a preset (openai-python, anthropic-python,
    /// vercel-ai-sdk), or `all`.
    #[arg(long, value_name = "effective|NAME|all", default_value = "all")]
    pub policy: String,
    /// Steps simulated per policy.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub steps: u64,
    /// The seed of the random draws; the same seed gives the same figures.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &GoodputArgs) -> Result<(), CliError> {
    if args.steps == 0 {
        return Err(CliError::bad_input(
            "--steps 0 simulates nothing; pass a positive number of steps.",
        ));
    }
    let model = fault_model(&args.fault_model)?;
    let policies = policies(&args.policy)?;
    let summaries: Vec<Summary> = policies
        .iter()
        .map(|(name, p)| simulate(name, p, &model, args.steps, args.seed))
        .collect();
    if args.json {
        let doc = serde_json::json!({
            "faultModel": args.fault_model,
            "steps": args.steps,
            "seed": args.seed,
            "model": model,
            "policies": summaries,
        });
        emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        ))
    } else {
        emit(&table(&summaries))
    }
}

/// The named model, or the file's, refused in one sentence when it is not sound.
fn fault_model(arg: &str) -> Result<FaultModel, CliError> {
    match arg {
        "seed" => Ok(FaultModel::seed()),
        "store" => store_model(),
        path => load_model(Path::new(path)),
    }
}

/// Runs the store must hold before a fit means anything.
const MIN_RUNS: u64 = 3;

/// The model fitted from the run store's figures (the ones `runs stats` prints).
fn store_model() -> Result<FaultModel, CliError> {
    let home = crate::home::Home::locate()?;
    let path = home.dir.join(crate::runs::STORE_FILE_NAME);
    let filter = Filter::default();
    let records = crate::runs_stats::load_records(&path, &filter)?;
    let stats = Stats::from_records(&records, &filter);
    let fitted = (stats.runs >= MIN_RUNS)
        .then(|| FaultModel::fit(&observed(&stats)))
        .flatten();
    fitted.ok_or_else(|| {
        CliError::bad_input(format!(
            "--fault-model store needs at least {MIN_RUNS} recorded runs with provider requests and {} has {}; run some compositions first, or pass --fault-model seed or a YAML file.",
            path.display(),
            stats.runs
        ))
    })
}

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

fn load_model(path: &Path) -> Result<FaultModel, CliError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::bad_input(format!(
            "cannot read the fault model {shown} ({}); pass seed, store, or the path of a YAML fault model.",
            plain_reason(&e.to_string(), "unreadable")
        ))
    })?;
    let model: FaultModel = docsfab_policy::host::from_yaml(&text).map_err(|e| {
        let (line, column, reason) = docsfab_policy::host::yaml_error_parts(&e, &text);
        CliError::bad_input(format!(
            "the fault model {shown} is not valid at line {line}, column {column}: {}; see docs/budgets.md for its fields.",
            reason.trim_end_matches('.')
        ))
    })?;
    match model.problem() {
        Some(p) => Err(CliError::bad_input(format!(
            "the fault model {shown} is not valid: {p}; correct it (docs/budgets.md)."
        ))),
        None => Ok(model),
    }
}

fn policies(arg: &str) -> Result<Vec<(String, Policy)>, CliError> {
    let peers = || PEERS.iter().map(|p| (p.name.to_string(), Policy::Peer(*p)));
    match arg {
        "effective" => Ok(vec![effective()?]),
        "all" => Ok(std::iter::once(effective()?).chain(peers()).collect()),
        name => peer(name)
            .map(|p| vec![(name.to_string(), Policy::Peer(p))])
            .ok_or_else(|| {
                let names: Vec<&str> = PEERS.iter().map(|p| p.name).collect();
                CliError::bad_input(format!(
                    "--policy {name:?} is not a policy; pass effective, all, or one of: {}.",
                    names.join(", ")
                ))
            }),
    }
}

/// docsfab's policy as this host resolves it (the same resolution `doctor` shows), with the
/// default attempt timer.
fn effective() -> Result<(String, Policy), CliError> {
    let ctx = HostContext::load()?;
    let p = DocsfabPolicy::from_limits(&ctx.limits, ctx.rules, DEFAULT_TIMEOUT_MS);
    Ok(("effective".to_string(), Policy::Docsfab(Box::new(p))))
}

fn table(rows: &[Summary]) -> String {
    let mut out = format!(
        "{:<18} {:>8} {:>9} {:>19} {:>9} {:>9} {:>8} {:>9}  bounds hit (share of steps)\n",
        "policy", "failed", "success", "95% CI", "p50 s", "p99 s", "req/ok", "wait s"
    );
    for s in rows {
        let bounds: Vec<String> = s
            .bounds_hit
            .iter()
            .map(|(b, share)| format!("{b} {:.3}%", share * 100.0))
            .collect();
        out.push_str(&format!(
            "{:<18} {:>8} {:>8.3}% {:>8.3}%..{:>7.3}% {:>9.1} {:>9.1} {:>8.3} {:>9.2}  {}\n",
            s.policy,
            s.steps - s.succeeded,
            s.success_rate * 100.0,
            s.success_ci95.low * 100.0,
            s.success_ci95.high * 100.0,
            s.p50_step_ms as f64 / 1000.0,
            s.p99_step_ms as f64 / 1000.0,
            s.requests_per_success,
            s.mean_wait_ms / 1000.0,
            if bounds.is_empty() {
                "none".to_string()
            } else {
                bounds.join(", ")
            }
        ));
    }
    out
}
