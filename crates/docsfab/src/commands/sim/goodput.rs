//! `docsfab sim goodput`: the Monte Carlo of docsfab's retry policy and the peers' defaults
//! against a fault model (docs/budgets.md). The simulation itself is `docsfab-goodput`.

use std::path::Path;

use clap::Args;
use docsfab_goodput::model::FaultModel;
use docsfab_goodput::policy::{DocsfabPolicy, PEERS, Policy, peer};
use docsfab_goodput::report::{Summary, simulate};
use docsfab_runtime::composition::DEFAULT_TIMEOUT_MS;

use docsfab_policy::catalog::{Limit, resolve};
use docsfab_policy::host::{RawKind, RawValue};

use crate::app::error::{CliError, emit, plain_reason};
use crate::app::fault_model::{MIN_RUNS, fit_store};
use crate::app::home::HostContext;

#[derive(Debug, Args)]
pub struct GoodputArgs {
    /// `seed` (the spec's published figures), `store` (fitted from recorded runs), or a YAML FILE.
    #[arg(long, value_name = "seed|store|FILE", default_value = "seed")]
    pub fault_model: String,
    /// `effective` (this host's resolved limits), a preset (openai-python, anthropic-python,
    /// vercel-ai-sdk, litellm), or `all`.
    #[arg(long, value_name = "effective|NAME|all", default_value = "all")]
    pub policy: String,
    /// Steps simulated per policy.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub steps: u64,
    /// The seed of the random draws; the same seed gives the same figures.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,
    /// Vary one limit of the effective policy over A..B (a catalog key such as
    /// `retry.maxTransportRetries`, or its `DOCSFAB_` variable); at most 21 points.
    #[arg(long, value_name = "KEY=A..B")]
    pub sweep: Option<String>,
    /// With --sweep: draw step success and p99 step time against the swept value (SVG).
    #[arg(long, value_name = "FILE.svg", requires = "sweep")]
    pub plot: Option<std::path::PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &GoodputArgs, store: Option<&str>) -> Result<(), CliError> {
    if args.steps == 0 {
        return Err(CliError::bad_input(
            "--steps 0 simulates nothing; pass a positive number of steps.",
        ));
    }
    let model = fault_model(&args.fault_model, store)?;
    let sweep = args.sweep.as_deref().map(parse_sweep).transpose()?;
    if let Some(plot) = &args.plot
        && plot.extension().and_then(|e| e.to_str()) != Some("svg")
    {
        return Err(CliError::bad_input(format!(
            "--plot {} does not end in .svg; only SVG plots are drawn, so name the file FILE.svg.",
            plot.display()
        )));
    }
    let policies = match &sweep {
        Some(sw) => swept_policies(sw)?,
        None => policies(&args.policy)?,
    };
    let summaries: Vec<Summary> = policies
        .iter()
        .map(|(name, p)| simulate(name, p, &model, args.steps, args.seed))
        .collect();
    if let (Some(path), Some(sw)) = (&args.plot, &sweep) {
        let svg = super::plot::svg(sw.limit.key(), &sw.values, &summaries);
        std::fs::write(path, svg).map_err(|e| {
            CliError::bad_input(format!(
                "cannot write the plot {} ({}); pass a writable path.",
                path.display(),
                plain_reason(&e.to_string(), "not writable")
            ))
        })?;
    }
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

/// The named model, or the file's, refused in one sentence when it is not sound. `store` is
/// the `--store` flag: the run store `--fault-model store` reads.
fn fault_model(arg: &str, store: Option<&str>) -> Result<FaultModel, CliError> {
    match arg {
        "seed" => Ok(FaultModel::seed()),
        "store" => store_model(store),
        path => load_model(Path::new(path)),
    }
}

/// The model fitted from the run store's figures (the ones `runs stats` prints).
fn store_model(store: Option<&str>) -> Result<FaultModel, CliError> {
    let home = crate::app::home::Home::locate()?;
    let path = crate::app::store::store_url(&home.dir, store)?;
    let (fitted, runs) = fit_store(&path)?;
    fitted.ok_or_else(|| {
        CliError::bad_input(format!(
            "--fault-model store needs at least {MIN_RUNS} recorded runs with provider requests and {} has {runs}; run some compositions first, or pass --fault-model seed or a YAML file.",
            crate::app::store::store_place(&path)
        ))
    })
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

/// A parsed `--sweep`.
struct Sweep {
    limit: Limit,
    values: Vec<u64>,
}

fn parse_sweep(arg: &str) -> Result<Sweep, CliError> {
    let bad = |why: &str| {
        CliError::bad_input(format!(
            "--sweep {arg:?} {why}; pass KEY=A..B with a catalog key such as retry.maxTransportRetries and whole numbers A <= B."
        ))
    };
    let (key, range) = arg.split_once('=').ok_or_else(|| bad("has no '='"))?;
    let limit = Limit::from_key(key)
        .or_else(|| Limit::ALL.into_iter().find(|l| l.env_var() == Some(key)))
        .ok_or_else(|| bad("names no limit"))?;
    let (a, b) = range
        .split_once("..")
        .ok_or_else(|| bad("has no range A..B"))?;
    let (a, b) = match (a.trim().parse::<u64>(), b.trim().parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b => (a, b),
        _ => return Err(bad("has no range of whole numbers A <= B")),
    };
    if a < limit.min() || b > limit.max() {
        return Err(CliError::bad_input(format!(
            "--sweep {arg:?} leaves the range of {} ({}..{}); sweep inside it (a host may only lower catalog limits).",
            limit.key(),
            limit.min(),
            limit.max()
        )));
    }
    let step = (b - a).div_ceil(20).max(1);
    let mut values: Vec<u64> = (0..=20)
        .map(|i| a.saturating_add(i * step).min(b))
        .collect();
    values.dedup();
    Ok(Sweep { limit, values })
}

/// The effective policy once per swept value: the value is given where the operator would give
/// it (host.yaml's catalog, or the environment for a limit host.yaml cannot set), and resolved
/// the way a run resolves it, so a value outside the limit's range is refused the same way.
fn swept_policies(sw: &Sweep) -> Result<Vec<(String, Policy)>, CliError> {
    let ctx = HostContext::load()?;
    let mut out = Vec::new();
    for &v in &sw.values {
        let mut host = ctx.host.clone();
        let mut env = ctx.env.clone();
        if let Some(var) = sw.limit.env_var() {
            env.remove(var);
        }
        if sw.limit.in_host_catalog() {
            host.catalog.insert(
                sw.limit.key().to_string(),
                RawValue {
                    text: v.to_string(),
                    kind: RawKind::Number,
                    line: 0,
                },
            );
        } else if let Some(var) = sw.limit.env_var() {
            env.insert(var.to_string(), v.to_string());
        }
        let limits = resolve(&host, &env)?;
        let p = DocsfabPolicy::from_limits(&limits, ctx.rules.clone(), DEFAULT_TIMEOUT_MS);
        out.push((
            format!("{}={v}", sw.limit.key()),
            Policy::Docsfab(Box::new(p)),
        ));
    }
    Ok(out)
}

/// docsfab's policy as this host resolves it (the same resolution `doctor` shows), with the
/// default attempt timer.
fn effective() -> Result<(String, Policy), CliError> {
    let ctx = HostContext::load()?;
    let p = DocsfabPolicy::from_limits(&ctx.limits, ctx.rules, DEFAULT_TIMEOUT_MS);
    Ok(("effective".to_string(), Policy::Docsfab(Box::new(p))))
}

fn table(rows: &[Summary]) -> String {
    let w = rows
        .iter()
        .map(|s| s.policy.len())
        .max()
        .unwrap_or(0)
        .max(18);
    let mut out = format!(
        "{:<w$} {:>8} {:>9} {:>19} {:>9} {:>9} {:>8} {:>9}  bounds hit (share of steps)\n",
        "policy", "failed", "success", "95% CI", "p50 s", "p99 s", "req/ok", "wait s"
    );
    for s in rows {
        let bounds: Vec<String> = s
            .bounds_hit
            .iter()
            .map(|(b, share)| format!("{b} {:.3}%", share * 100.0))
            .collect();
        out.push_str(&format!(
            "{:<w$} {:>8} {:>8.3}% {:>8.3}%..{:>7.3}% {:>9.1} {:>9.1} {:>8.3} {:>9.2}  {}\n",
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
