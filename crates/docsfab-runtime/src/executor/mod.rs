//! Running a composition: steps in order, each step's attempts, and the run record as it goes.
//!
//! Per step, attempt 1 is paid from the `initial` budget. After each failed attempt the driver
//! asks the step policy once whether to retry, from which budget and after how long:
//! `docsfab_policy::step::decide` for a read-only step, `step::decide_write` with the proven
//! write settlement for a write step, which may answer "restore first" (the restore runs, and
//! `PendingRestore::after_restore` decides on its result). It does what the answer says, records
//! the decision on the attempt, commits the attempt to the run store, and only then waits and
//! starts the next attempt. Every attempt is a fresh
//! [`agent::run_attempt`] with the composition's sealed ceilings and a restored source-read
//! budget (STP-2), so a run that does not fail makes exactly one attempt per step.
//!
//! The run builds one response boundary from the provider's API, the selected model and the
//! API key (as a host secret labelled with its variable), and every attempt checks each
//! completed turn's raw 200 body against it before using it (BND-1, STP-14): the runtime's own
//! turns meet the same check as the composition route's clients.
//!
//! Cancellation is one token for the run, a child of the caller's: the caller (Ctrl-C) or the
//! job deadline (`runtime.deadlineMilliseconds`) cancels it, and everything that waits (provider
//! requests, replay backoffs, step backoffs) races it, so the run ends at once and is recorded
//! `cancelled` with the reason.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use docsfab_boundary::{BoundaryConfig, Secret};
use docsfab_policy::catalog::EffectiveLimits;
use docsfab_policy::host::StructuredOutput;
use docsfab_policy::rules::{Feedback, RulesTable};
use docsfab_policy::step::{
    self, AttemptFailure, PastAttempt, StepAccess::ReadOnly, StepBudgets, StepDecision,
    WriteDecision, WritePlan, WriteSettlement as PolicySettlement,
};
use docsfab_provider::{
    ApiKey, Gate, HttpConfig, HttpTransport, RunBudget, SpendLimits, Transport, TransportBuildError,
};
use docsfab_record::Api;
use docsfab_record::Pricing;
use docsfab_throttle::Throttle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent::{self, Answer, AttemptInput, AttemptReport, AttemptSpend, TurnEvent};
use crate::batch::{BeforeWrite, WriteVeto};
use crate::composition::{Access, Composition, Step, Tool, output_references};
use crate::fanout::WriteClaims;
use crate::grounding::GroundingBasis;
use crate::record::{
    AttemptRecord, AttemptStatus, Budget, Retry, RetryDecision, RunContext, RunLink, RunProvider,
    RunStatus, StepFailure, WriteRestore,
};
use crate::reuse::{Asking, Looks, Reference, fingerprint};
use crate::settlement::settle_attempt;
use crate::snapshot::{RestoreError, WrittenFile};
use crate::store::{JobSpec, ResultBasis, RunStore, StepEnd, StepStart, StoreError};
use crate::workspace::Workspace;
use crate::written::{Kept, classify};

mod instances;
mod pages;
use crate::store::StepLog;

/// The provider a run talks to, as host.yaml names it, with the key already read from the
/// variable `apiKeyEnv` names. The key is only ever put in the request header.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// The provider's key under host.yaml's `providers:` (the run record names it).
    pub name: String,
    pub api: Api,
    /// Including the version prefix, e.g. `https://api.example.com/v1`.
    pub base_url: String,
    /// The provider's default model; the composition's `model` wins when set.
    pub model: String,
    /// `None` sends no auth header (a local simulator needs none). Give it the name of its
    /// variable with [`ApiKey::with_label`]: a response that carries the key's value is then
    /// refused naming that variable.
    pub api_key: Option<ApiKey>,
    /// What host.yaml says of the provider's usage, prices and cost budget.
    pub spend: SpendSettings,
    /// How a contract step's schema is sent as a structured-output constraint.
    pub structured_output: StructuredOutput,
}

/// How a run asks for usage, what it prices it at and what it may spend (host.yaml's
/// `includeUsage`, `promptCaching`, `pricing` and `budget.maxRunCostUsd`; docs/cost.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpendSettings {
    /// OpenAI: ask for the usage chunk with `stream_options` (default true).
    pub include_usage: bool,
    /// Mark the stable prefix for the provider's prompt cache (default true).
    pub prompt_caching: bool,
    /// `None`: no price, so every `costUsd` is `null`.
    pub pricing: Option<Pricing>,
    /// Host.yaml validation guarantees a price beside it.
    pub max_run_cost_usd: Option<f64>,
}

impl Default for SpendSettings {
    fn default() -> Self {
        SpendSettings {
            include_usage: true,
            prompt_caching: true,
            pricing: None,
            max_run_cost_usd: None,
        }
    }
}

/// The label of a key found in a response when the key came without one.
const UNLABELLED_KEY: &str = "provider-api-key";

/// The run's response boundary: the provider's API, the selected model, and the key's value as
/// a host secret (a key under 8 bytes cannot be searched for; every known key shape still is).
fn boundary_config(provider: &ProviderSettings, model: &str) -> Result<BoundaryConfig, String> {
    let secrets: Vec<Secret> = provider
        .api_key
        .iter()
        .filter_map(|k| Secret::new(k.label().unwrap_or(UNLABELLED_KEY), k.expose()).ok())
        .collect();
    BoundaryConfig::new(provider.api, model, &secrets).map_err(|e| e.to_string())
}

pub use crate::progress::{Progress, ProgressSink, countdown_text};

/// Everything a run needs. Build it after the whole configuration was validated.
pub struct RunConfig {
    pub composition: Composition,
    /// The workspace directory the tools work in.
    pub workspace: PathBuf,
    pub provider: ProviderSettings,
    pub limits: EffectiveLimits,
    pub rules: RulesTable,
    /// The caller's cancellation (Ctrl-C).
    pub cancel: CancellationToken,
    /// The job deadline; `None` uses `runtime.deadlineMilliseconds` from `limits`.
    pub job_deadline: Option<Duration>,
    pub progress: Option<ProgressSink>,
    /// The shared provider throttle (`DOCSFAB_HOME/throttle.db`) every provider request of the
    /// run passes, fan-out instances included; `None` sends at once.
    pub throttle: Option<Throttle>,
    /// An earlier run whose results this run may carry over instead of asking again
    /// (`runs resume`, `run --reuse`); `None` runs every step.
    pub carry: Option<Carry>,
    /// The composition as submitted, kept with the run so `runs resume` can start it again;
    /// `None` keeps none (a claimed job has its own already).
    pub spec: Option<JobSpec>,
}

/// The earlier run a run carries results over from (crate::reuse, docs/resume.md).
#[derive(Debug, Clone)]
pub struct Carry {
    pub reference: Reference,
    /// Set by `runs resume`: the record names the reference run as `resumedFrom`.
    pub resume: bool,
    /// `--allow-lost-pages`: a pages step may write fewer pages than the reference run's did
    /// (docs/pages.md); otherwise it stops before writing and names the pages it would lose.
    pub allow_lost_pages: bool,
}

/// Why a run was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The caller cancelled (Ctrl-C).
    Caller,
    /// The job deadline fired.
    JobDeadline { deadline_ms: u64 },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    pub run_id: String,
    pub status: RunStatus,
    pub cancel_reason: Option<CancelReason>,
}

/// A run that could not be carried out. Step failures are not errors: they are in the record.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Workspace(String),
    #[error("the provider transport cannot be set up: {0}")]
    Transport(#[from] TransportBuildError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Runs a composition to its end and returns the run id and its final status. The run is in
/// `store` from its first moment; each finished attempt is committed before the next starts.
pub async fn run_composition(cfg: RunConfig, store: &mut RunStore) -> Result<RunOutcome, RunError> {
    run_over_http(cfg, None, store).await
}

/// [`run_composition`] into a run this process already claimed from the queue
/// ([`RunStore::claim_next`]): that `running` run gets its context and the steps, instead of a
/// new run being created. A claimed run that cannot start (its workspace or transport cannot be
/// set up) is finished `failed`, so it does not stay `running` under a live owner.
pub async fn run_claimed(
    cfg: RunConfig,
    run_id: String,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    run_over_http(cfg, Some(run_id), store).await
}

/// [`run_with_transport`] into an already claimed run (see [`run_claimed`]).
pub async fn run_claimed_with_transport(
    cfg: RunConfig,
    run_id: String,
    workspace: &Workspace,
    transport: &dyn Transport,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    run_into(cfg, Some(run_id), workspace, transport, store).await
}

/// Opens the workspace and the provider's HTTP transport, then runs into `claimed` (or a new
/// run when `None`).
async fn run_over_http(
    cfg: RunConfig,
    claimed: Option<String>,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    let setup = open_workspace(&cfg).and_then(|w| Ok((w, http_transport(&cfg)?)));
    let (workspace, transport) = match setup {
        Ok(ready) => ready,
        Err(e) => {
            if let Some(run_id) = &claimed {
                let _ = store.finish_run_because(run_id, RunStatus::Failed, &e.to_string());
            }
            return Err(e);
        }
    };
    run_into(cfg, claimed, &workspace, &transport, store).await
}

fn open_workspace(cfg: &RunConfig) -> Result<Workspace, RunError> {
    Workspace::open(&cfg.workspace).map_err(|e| RunError::Workspace(e.evidence))
}

fn http_transport(cfg: &RunConfig) -> Result<HttpTransport, RunError> {
    // The raw body is kept for the response boundary (BND-1), which judges it as it is read.
    let mut transport = HttpTransport::new(HttpConfig {
        keep_raw_body: true,
        ..HttpConfig::new(
            cfg.provider.api,
            cfg.provider.base_url.clone(),
            cfg.provider.api_key.clone(),
        )
    })?;
    if let Ok(boundary) = boundary_config(&cfg.provider, &selected_model(cfg)) {
        transport = transport.with_boundary(boundary);
    }
    Ok(transport)
}

/// [`run_composition`] over a given transport (a test or an embedded route may bring its own).
pub async fn run_with_transport(
    cfg: RunConfig,
    workspace: &Workspace,
    transport: &dyn Transport,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    run_into(cfg, None, workspace, transport, store).await
}

/// The one body of every entry above: the run is `claimed` (running already, its context set
/// here) or created now with its context.
async fn run_into(
    cfg: RunConfig,
    claimed: Option<String>,
    workspace: &Workspace,
    transport: &dyn Transport,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    let context = run_context(&cfg, workspace);
    let run_id = match claimed {
        Some(run_id) => {
            store.set_context(&run_id, &context)?;
            run_id
        }
        None => match &cfg.spec {
            Some(spec) => store.create_run_from(&context, spec)?,
            None => store.create_run_with_context(&cfg.composition.name, &context)?,
        },
    };
    let cancel = cfg.cancel.child_token();
    let deadline_ms = cfg.job_deadline.map_or(cfg.limits.deadline_ms(), |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    });
    let deadline_fired = Arc::new(AtomicBool::new(false));
    let timer = {
        let cancel = cancel.clone();
        let fired = Arc::clone(&deadline_fired);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(deadline_ms)).await;
            fired.store(true, Ordering::SeqCst);
            cancel.cancel();
        })
    };

    let boundary = boundary_config(&cfg.provider, &selected_model(&cfg));
    let model = selected_model(&cfg);
    let ctx = Ctx {
        model: &model,
        taken: Mutex::new(HashSet::new()),
        grounding: Mutex::new(None),
        pages: Mutex::new(BTreeSet::new()),
        text_needed: text_needed(&cfg.composition),
        cfg: &cfg,
        workspace,
        transport,
        boundary: &boundary,
        cancel: &cancel,
        deadline_fired: &deadline_fired,
        deadline_ms,
        run_id: &run_id,
        budget: RunBudget::new(SpendLimits {
            max_run_tokens: cfg.composition.limits.max_run_tokens,
            max_run_cost_usd: cfg
                .provider
                .spend
                .max_run_cost_usd
                .zip(cfg.provider.spend.pricing),
        }),
    };
    ctx.emit(Progress::RunStarted {
        run_id: run_id.clone(),
    });
    let result = run_steps(&ctx, store).await;
    timer.abort();
    let status = match result {
        Ok(s) => s,
        Err(e) => {
            // Keep the record honest: a run the store could not follow to its end failed, and
            // its steps cannot say why.
            let _ = store.finish_run_because(&run_id, RunStatus::Failed, &e.to_string());
            return Err(e);
        }
    };
    store.finish_run(&run_id, status)?;
    let cancel_reason = (status == RunStatus::Cancelled).then(|| ctx.cancel_reason());
    Ok(RunOutcome {
        run_id,
        status,
        cancel_reason,
    })
}

/// What the record says about where and with what the run worked. The provider's host is its
/// base URL's host and port only, so user information or a query in the URL never reaches it.
fn run_context(cfg: &RunConfig, workspace: &Workspace) -> RunContext {
    let provider = &cfg.provider;
    RunContext {
        workspace: workspace.root().to_string_lossy().into_owned(),
        provider: RunProvider {
            name: provider.name.clone(),
            api: provider.api,
            host: docsfab_policy::host::base_url_host(&provider.base_url)
                .unwrap_or_else(|| "-".to_owned()),
        },
        model: selected_model(cfg),
        docsfab_version: env!("CARGO_PKG_VERSION").to_owned(),
        resumed_from: cfg.carry.as_ref().filter(|c| c.resume).map(|c| RunLink {
            run_id: c.reference.run_id().to_owned(),
        }),
    }
}

/// The composition's model, or the provider's.
fn selected_model(cfg: &RunConfig) -> String {
    cfg.composition
        .model
        .clone()
        .unwrap_or_else(|| cfg.provider.model.clone())
}

struct Ctx<'a> {
    cfg: &'a RunConfig,
    model: &'a str,
    /// The reference steps already carried over into this run (each stands in once).
    taken: Mutex<HashSet<usize>>,
    /// The steps whose answer text a later step inserts or fans out over.
    text_needed: HashSet<String>,
    workspace: &'a Workspace,
    transport: &'a dyn Transport,
    boundary: &'a Result<BoundaryConfig, String>,
    cancel: &'a CancellationToken,
    deadline_fired: &'a AtomicBool,
    deadline_ms: u64,
    run_id: &'a str,
    /// The run's token and cost budget, shared by every attempt and instance.
    budget: Option<RunBudget>,
    /// The workspace's grounding index with the step it was read for (instances of one
    /// fan-out step share it: they are read-only, so the tree does not change between them).
    grounding: Mutex<Option<(String, Arc<docsfab_grounding::Index>)>>,
    /// The paths of the pages earlier steps of this run answered: a later page may link them.
    pages: Mutex<BTreeSet<String>>,
}

impl Ctx<'_> {
    /// The fingerprint of `step` asked with `instructions` in this run.
    fn fingerprint(&self, step: &Step, instructions: &str) -> String {
        let asking = Asking {
            provider: &self.cfg.provider.name,
            api: self.cfg.provider.api,
            model: self.model,
        };
        fingerprint(step, instructions, &self.cfg.composition.limits, asking)
    }

    /// The reference step that can stand in for `step` of group `group` (asked with
    /// `fingerprint`), taken so no other step uses it; judged against the workspace as `looks`
    /// reads it.
    fn reusable(&self, group: &str, fingerprint: &str, looks: &mut Looks) -> Option<usize> {
        let reference = &self.cfg.carry.as_ref()?.reference;
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        let at = reference.candidate(group, fingerprint, &taken)?;
        let step = reference.step(at);
        // An answer the record does not keep (a text answer) can stand in only where no later
        // step needs its text.
        if step.output.is_none() && self.text_needed.contains(group) {
            return None;
        }
        if !reference.changed(self.workspace, at, looks).is_empty() {
            return None;
        }
        taken.insert(at);
        Some(at)
    }

    /// Records begun step `step_index` as carried over from reference step `at`, and returns
    /// its output text as later steps see it.
    fn carry_over(
        &self,
        store: &mut (dyn StepLog + Send),
        step: &Step,
        step_index: u32,
        at: usize,
    ) -> Result<(RunStatus, Option<String>), RunError> {
        let reference = &self
            .cfg
            .carry
            .as_ref()
            .expect("a carried step has a reference")
            .reference;
        let from = reference.step(at);
        let end = StepEnd {
            status: RunStatus::Succeeded,
            failure: None,
            output: from.output.clone(),
            basis: Some(ResultBasis {
                fingerprint: from.fingerprint.clone().unwrap_or_default(),
                inputs: from.inputs.clone().unwrap_or_default(),
                reused_from: Some(reference.origin(at)),
                files_written: Some(from.result_files().to_vec()),
            }),
        };
        store.finish_step(self.run_id, step_index, &end)?;
        self.emit(Progress::StepReused {
            step_id: step.id.clone(),
            from: reference.origin(at),
        });
        Ok((
            RunStatus::Succeeded,
            Some(
                from.output
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            ),
        ))
    }

    /// Notes the pages an accepted output holds, so later pages may link them.
    fn note_pages(&self, output: &str) {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(output) else {
            return;
        };
        self.pages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(crate::grounding::page_paths(&value));
    }

    fn emit(&self, p: Progress) {
        if let Some(sink) = &self.cfg.progress {
            sink(&p);
        }
    }

    fn cancel_reason(&self) -> CancelReason {
        if self.deadline_fired.load(Ordering::SeqCst) {
            CancelReason::JobDeadline {
                deadline_ms: self.deadline_ms,
            }
        } else {
            CancelReason::Caller
        }
    }

    /// The files a succeeded attempt changed, each judged for the run store (written.rs).
    fn kept_contents(&self, report: &AttemptReport) -> Vec<(WrittenFile, Kept)> {
        let default = docsfab_boundary::Redactor::default();
        let redactor = self.boundary.as_ref().map_or(&default, |b| b.redactor());
        report
            .written
            .iter()
            .map(|f| (f.clone(), classify(f, |t| redactor.holds_credential(t))))
            .collect()
    }

    /// The end of a cancelled step, with its failure.
    fn cancelled_end(&self) -> StepEnd {
        StepEnd {
            status: RunStatus::Cancelled,
            failure: Some(self.cancelled_failure()),
            output: None,
            basis: None,
        }
    }

    /// The step failure of a cancelled step, naming why it was cancelled.
    fn cancelled_failure(&self) -> StepFailure {
        match self.cancel_reason() {
            CancelReason::Caller => StepFailure {
                category: "cancelled".into(),
                failure_class: "cancelled".into(),
                code: "cancelled".into(),
                message: "The run was cancelled by the caller.".into(),
                remediation: "Run it again when ready.".into(),
                context: None,
            },
            CancelReason::JobDeadline { deadline_ms } => StepFailure {
                category: "cancelled".into(),
                failure_class: "cancelled".into(),
                code: "job-deadline".into(),
                message: format!(
                    "The job deadline fired: runtime.deadlineMilliseconds = {deadline_ms} ms."
                ),
                remediation: "Raise runtime.deadlineMilliseconds (up to its catalog maximum), lower DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES, or seal a shorter timeoutMs.".into(),
                context: None,
            },
        }
    }
}

async fn run_steps(ctx: &Ctx<'_>, store: &mut RunStore) -> Result<RunStatus, RunError> {
    let mut outputs: BTreeMap<String, String> = BTreeMap::new();
    for step in &ctx.cfg.composition.steps {
        if ctx.cancel.is_cancelled() {
            // Cancelled between steps: the next step is recorded with no attempt and the reason,
            // so the record says why the run stopped.
            let index = store.begin_step(ctx.run_id, &step_start(ctx, step))?;
            store.finish_step(ctx.run_id, index, &ctx.cancelled_end())?;
            return Ok(RunStatus::Cancelled);
        }
        let (status, output) = match &step.fan_out {
            Some(fan) => instances::run_fan_out(ctx, store, step, fan, &outputs).await?,
            None if step.writes_pages() => pages::run_pages_step(ctx, store, step, &outputs)?,
            None => run_step(ctx, store, step, &outputs).await?,
        };
        ctx.emit(Progress::StepFinished {
            step_id: step.id.clone(),
            status,
        });
        match (status, output) {
            (RunStatus::Succeeded, Some(out)) => {
                ctx.note_pages(&out);
                outputs.insert(step.id.clone(), out);
            }
            (RunStatus::Succeeded, None) => {}
            (other, _) => return Ok(other),
        }
    }
    Ok(RunStatus::Succeeded)
}

/// Replaces each `{{steps.ID.output}}` with that step's output text.
pub fn substitute_outputs(text: &str, outputs: &BTreeMap<String, String>) -> String {
    let Ok(refs) = output_references(text) else {
        return text.to_owned();
    };
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for r in refs {
        out.push_str(&text[at..r.range.start]);
        out.push_str(outputs.get(&r.step_id).map_or("", String::as_str));
        at = r.range.end;
    }
    out.push_str(&text[at..]);
    out
}

/// The step as the store starts it: its access and the retry limits it applies.
fn step_start(ctx: &Ctx<'_>, step: &Step) -> StepStart {
    let limits = &ctx.cfg.limits;
    StepStart {
        step_id: step.id.clone(),
        access: step.access,
        configured_max_retries: limits.configured_max_retries(),
        effective_max_retries: limits.effective_max_retries(),
        transport_retry: limits.transport_retry(),
    }
}

async fn run_step(
    ctx: &Ctx<'_>,
    store: &mut RunStore,
    step: &Step,
    outputs: &BTreeMap<String, String>,
) -> Result<(RunStatus, Option<String>), RunError> {
    let instructions = substitute_outputs(&step.instructions, outputs);
    let reused = ctx.reusable(
        &step.id,
        &ctx.fingerprint(step, &instructions),
        &mut Looks::default(),
    );
    let step_index = store.begin_step(ctx.run_id, &step_start(ctx, step))?;
    if let Some(at) = reused {
        return ctx.carry_over(&mut **store, step, step_index, at);
    }
    run_begun_step(ctx, &mut **store, step, step_index, instructions, None).await
}

/// The steps whose answer text a later step needs: named in instructions, or fanned out over.
fn text_needed(composition: &Composition) -> HashSet<String> {
    let mut needed = HashSet::new();
    for step in &composition.steps {
        for r in output_references(&step.instructions).unwrap_or_default() {
            needed.insert(r.step_id);
        }
        if let Some(fan) = &step.fan_out {
            needed.insert(fan.step_id.clone());
        }
    }
    needed
}

/// Runs a step the store has begun as `step_index`: its attempts, to its end. `claims` is set
/// for an instance of a fan-out step, whose writes must not touch a sibling's paths.
async fn run_begun_step(
    ctx: &Ctx<'_>,
    store: &mut (dyn StepLog + Send),
    step: &Step,
    step_index: u32,
    instructions: String,
    claims: Option<&WriteClaims>,
) -> Result<(RunStatus, Option<String>), RunError> {
    ctx.emit(Progress::StepStarted {
        step_id: step.id.clone(),
        access: step.access,
    });
    let run = StepRun {
        ctx,
        step,
        step_index,
        budgets: ctx.cfg.limits.step_budgets(),
        fingerprint: ctx.fingerprint(step, &instructions),
        instructions,
        model: selected_model(ctx.cfg),
        claims,
        grounding: grounding_basis(ctx, step),
    };
    // The unknown names of the last ungrounded answer, for the correction that follows it.
    let mut grounding_correction: Option<String> = None;
    let mut past: Vec<PastAttempt> = Vec::new();
    // What is left of the step retry's wait ceiling once its own wait is over: the most the
    // throttle may hold the retry's first request (the policy decides how long, the throttle
    // only when). `None` for the first attempt.
    let mut first_patience: Option<Duration> = None;

    // Every way out of the loop ends the step: its end goes to the store once, below.
    let (end, output_text) = loop {
        let attempt_no = u32::try_from(past.len() + 1).unwrap_or(u32::MAX);
        let budget = step::current_budget(&past);
        ctx.emit(Progress::AttemptStarted {
            step_id: step.id.clone(),
            attempt: attempt_no,
            budget,
        });
        let report = run
            .attempt(
                store,
                attempt_no,
                step::current_feedback(&past),
                first_patience,
                grounding_correction.as_deref(),
            )
            .await;
        // A retry's wait counts from here: recording the attempt (a durable commit) and
        // deciding take time that is part of the wait, not added to it, so the gap on the wire
        // is the recorded waitMs.
        let ended = Instant::now();

        let failure = match &report.result {
            Ok(answer) => {
                let record = attempt_record(attempt_no, budget, &report, None, None);
                let files = ctx.kept_contents(&report);
                store.record_attempt_with_files(ctx.run_id, step_index, &record, &files)?;
                emit_finished(ctx, step, &record);
                let basis = ResultBasis {
                    fingerprint: run.fingerprint.clone(),
                    inputs: report.inputs.clone(),
                    reused_from: None,
                    files_written: None,
                };
                break (succeeded(answer, basis), Some(answer.as_output_text()));
            }
            Err(f) => f.clone(),
        };
        grounding_correction = next_correction(grounding_correction, &failure, &report);

        let (record, decision) = run.decide(&past, &failure, &report, attempt_no, budget);
        // Durable before anything else happens (the next attempt, or the step's end).
        store.record_attempt_with_files(ctx.run_id, step_index, &record, &[])?;
        emit_finished(ctx, step, &record);

        match decision {
            StepDecision::Retry { retry, .. } => {
                past.push(PastAttempt {
                    duration_ms: report.duration_ms,
                    retry,
                });
                if !backoff(ctx, step, attempt_no + 1, ended, retry.wait_ms).await {
                    break (ctx.cancelled_end(), None);
                }
                first_patience = Some(Duration::from_millis(
                    run.budgets
                        .transport_max_delay_ms
                        .saturating_sub(retry.wait_ms),
                ));
            }
            StepDecision::End { failure: f, .. } => {
                let end = match failure {
                    AttemptFailure::Cancelled => ctx.cancelled_end(),
                    _ => failed(naming_unknowns(f, &report)),
                };
                break (end, None);
            }
        }
    };
    store.finish_step(ctx.run_id, step_index, &end)?;
    Ok((end.status, output_text))
}

/// What a step whose contract names members to ground is judged against: the workspace index
/// and the run's pages so far. The index is read once per step, and once for all the instances
/// of a fan-out step (`pages[0]`, `pages[1]`, ... share `pages`'s).
fn grounding_basis(ctx: &Ctx<'_>, step: &Step) -> Option<GroundingBasis> {
    step.contract.as_ref().filter(|c| !c.grounding.is_empty())?;
    let pages = ctx
        .pages
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let group = step.id.split('[').next().unwrap_or(&step.id);
    let mut cached = ctx.grounding.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((read_for, index)) = cached.as_ref()
        && read_for == group
    {
        let index = Arc::clone(index);
        return Some(GroundingBasis { index, pages });
    }
    let (index, _cut) =
        crate::grounding::index_workspace(ctx.workspace.root(), &Default::default());
    let index = Arc::new(index);
    *cached = Some((group.to_owned(), Arc::clone(&index)));
    Some(GroundingBasis { index, pages })
}

/// The grounding correction the next attempt carries: the unknown names of an ungrounded
/// answer; kept across attempts that were not judged (a transport fault), dropped when a
/// judged answer failed for another reason.
fn next_correction(
    previous: Option<String>,
    failure: &AttemptFailure,
    report: &AttemptReport,
) -> Option<String> {
    match failure {
        AttemptFailure::Contract {
            failure: docsfab_record::ContractFailure::Ungrounded,
        } => report.grounding.as_ref().map(crate::grounding::correction),
        AttemptFailure::Contract { .. } | AttemptFailure::CutAnswer => None,
        _ => previous,
    }
}

/// A step's end when an attempt's answer was accepted.
fn succeeded(answer: &Answer, basis: ResultBasis) -> StepEnd {
    StepEnd {
        status: RunStatus::Succeeded,
        failure: None,
        output: answer.record_output(),
        basis: Some(basis),
    }
}

/// A step's end when the policy ended it on `failure`.
/// A step that ended ungrounded says which names its last answer invented (the attempt's
/// message lists them), so the failure alone tells the operator what was wrong.
fn naming_unknowns(mut failure: StepFailure, report: &AttemptReport) -> StepFailure {
    if let (true, Some(why)) = (failure.code == "contract-ungrounded", &report.message) {
        failure.message = format!("{} In the last answer, {why}.", failure.message);
    }
    failure
}

fn failed(failure: StepFailure) -> StepEnd {
    StepEnd {
        status: RunStatus::Failed,
        failure: Some(failure),
        output: None,
        basis: None,
    }
}

/// One step as it runs: what every attempt of it shares.
struct StepRun<'c, 'a> {
    ctx: &'c Ctx<'a>,
    step: &'c Step,
    step_index: u32,
    budgets: StepBudgets,
    /// What the step is asked with, hashed (crate::reuse::fingerprint).
    fingerprint: String,
    /// The step's instructions with earlier outputs substituted.
    instructions: String,
    model: String,
    /// The paths of a fan-out step's instances, when this step is one of them.
    claims: Option<&'c WriteClaims>,
    /// What the step's answers are judged against when its contract asks for grounding
    /// (docs/grounding.md).
    grounding: Option<GroundingBasis>,
}

impl StepRun<'_, '_> {
    /// Runs attempt `attempt_no`, carrying `feedback` (with the unknown names of an ungrounded
    /// answer, `grounding_correction`), and reports its turns to progress. The throttle may
    /// hold its first request at most `first_patience` (see the caller).
    async fn attempt(
        &self,
        store: &mut (dyn StepLog + Send),
        attempt_no: u32,
        feedback: Option<Feedback>,
        first_patience: Option<Duration>,
        grounding_correction: Option<&str>,
    ) -> AttemptReport {
        let (ctx, step) = (self.ctx, self.step);
        let cfg = ctx.cfg;
        let step_id = step.id.clone();
        let sink = cfg.progress.clone();
        let observer = move |event: TurnEvent| {
            if let Some(sink) = &sink {
                sink(&Progress::Turn {
                    step_id: step_id.clone(),
                    attempt: attempt_no,
                    event,
                });
            }
        };
        // A write step commits each write's intent to the store before the write runs, so a
        // process killed mid-attempt still leaves an account of what it wrote.
        let shared = Mutex::new(store);
        let (run_id, step_index, claims) = (ctx.run_id, self.step_index, self.claims);
        let record_intent = |tool: Tool, path: &str| {
            // A sibling instance's path is refused to the model before any intent is kept.
            if let Some(claims) = claims {
                claims.claim(path, &step.id).map_err(WriteVeto::Refused)?;
            }
            shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record_write_intent(run_id, step_index, attempt_no, tool.name(), path)
                .map_err(|e| WriteVeto::Unrecorded(e.to_string()))
        };
        let before_write: Option<BeforeWrite<'_>> =
            (step.access == Access::Write).then_some(&record_intent);
        agent::run_attempt(AttemptInput {
            transport: ctx.transport,
            gate: cfg.throttle.as_ref().map(|throttle| Gate {
                throttle,
                provider: &cfg.provider.name,
                first_patience,
            }),
            api: cfg.provider.api,
            model: &self.model,
            step,
            limits: cfg.composition.limits,
            replay_limits: cfg.limits.replay_limits(),
            boundary: ctx.boundary.as_ref().map_err(String::as_str),
            instructions: &self.instructions,
            feedback,
            workspace: ctx.workspace,
            cancel: ctx.cancel,
            observer: &observer,
            before_write,
            spend: AttemptSpend {
                budget: ctx.budget.as_ref(),
                pricing: cfg.provider.spend.pricing,
                include_usage: cfg.provider.spend.include_usage,
                prompt_cache_key: cfg
                    .provider
                    .spend
                    .prompt_caching
                    .then(|| format!("docsfab/{}/{}", cfg.composition.name, step.id)),
            },
            structured_output: cfg.provider.structured_output,
            grounding: self.grounding.as_ref(),
            grounding_correction,
        })
        .await
    }

    /// Decides a failed attempt and builds its record. A write step first proves what it wrote;
    /// a retry that needs a restore only goes ahead once the restore is verified (WRT-1..3).
    fn decide(
        &self,
        past: &[PastAttempt],
        failure: &AttemptFailure,
        report: &AttemptReport,
        attempt_no: u32,
        budget: Budget,
    ) -> (AttemptRecord, StepDecision) {
        let provisional = attempt_record(attempt_no, budget, report, None, None);
        let AfterFailure {
            decision,
            settlement,
            restore,
            restore_error,
        } = self.decide_after_failure(past, failure, report, &provisional);
        // The step's ending failure when it ends, else the attempt's own failure as it stands.
        let facts = decision
            .failure()
            .cloned()
            .unwrap_or_else(|| step::failure_facts(failure));
        let decided = Decided {
            decision: &decision,
            failure,
            facts,
        };
        let mut record = attempt_record(attempt_no, budget, report, Some(decided), settlement);
        record.write_restore = restore;
        if let Some(e) = restore_error {
            // Say which file could not be put back, so the operator knows what to inspect.
            let why = format!("the workspace restore failed: {e}");
            record.message = Some(match record.message.take() {
                Some(m) => format!("{m}; {why}"),
                None => why,
            });
        }
        (record, decision)
    }

    /// Decides the failed attempt, asking the policy once per phase. For a write step the
    /// settlement is computed from the attempt's recorded turns and lease (every batch reconciled
    /// with the lease's counters, WRT-2); when the policy asks for a restore first (WRT-1), the
    /// restore runs and is verified, and the policy's second phase decides on its result.
    fn decide_after_failure(
        &self,
        past: &[PastAttempt],
        failure: &AttemptFailure,
        report: &AttemptReport,
        provisional: &AttemptRecord,
    ) -> AfterFailure {
        let (rules, budgets) = (&self.ctx.cfg.rules, &self.budgets);
        let duration_ms = report.duration_ms;
        if self.step.access == Access::ReadOnly {
            let decision = step::decide(rules, budgets, ReadOnly, past, failure, duration_ms);
            return AfterFailure::decided(decision, None);
        }
        let proven = settle_attempt(provisional).settlement;
        let pending = match step::decide_write(rules, budgets, past, failure, duration_ms, proven) {
            WritePlan::Decided(d) => return AfterFailure::decided(d.decision, Some(d.settlement)),
            WritePlan::RestoreFirst(pending) => pending,
        };
        let restored = report.snapshots.restore();
        let WriteDecision {
            settlement,
            decision,
        } = pending.after_restore(restored.is_ok());
        AfterFailure {
            decision,
            settlement: Some(settlement),
            restore: Some(if restored.is_ok() {
                WriteRestore::Restored
            } else {
                WriteRestore::RestoreFailed
            }),
            restore_error: restored.err(),
        }
    }
}

fn emit_finished(ctx: &Ctx<'_>, step: &Step, record: &AttemptRecord) {
    ctx.emit(Progress::AttemptFinished {
        step_id: step.id.clone(),
        attempt: record.attempt,
        status: record.status,
        retry_decision: record.retry.decision,
        retry_rule: record.retry_rule.clone(),
        wait_ms: record.wait_ms,
        message: record.message.clone(),
    });
}

/// Waits until `wait_ms` after `from` (when the failed attempt ended) before the next attempt,
/// telling progress about once a second. Returns false when the run was cancelled during the
/// wait (the wait ends at once).
async fn backoff(
    ctx: &Ctx<'_>,
    step: &Step,
    next_attempt: u32,
    from: Instant,
    wait_ms: u64,
) -> bool {
    let end = from + Duration::from_millis(wait_ms);
    loop {
        if ctx.cancel.is_cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        let remaining = end - now;
        ctx.emit(Progress::Backoff {
            step_id: step.id.clone(),
            next_attempt,
            remaining_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
        });
        let tick = remaining.min(Duration::from_secs(1));
        tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return false,
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

/// What was decided about a failed attempt, and what became of its writes.
struct AfterFailure {
    decision: StepDecision,
    settlement: Option<PolicySettlement>,
    /// Set when a restore of the attempt's writes ran.
    restore: Option<WriteRestore>,
    /// Why that restore failed.
    restore_error: Option<RestoreError>,
}

impl AfterFailure {
    fn decided(decision: StepDecision, settlement: Option<PolicySettlement>) -> AfterFailure {
        AfterFailure {
            decision,
            settlement,
            restore: None,
            restore_error: None,
        }
    }
}

/// What was decided about a failed attempt, for its record.
struct Decided<'a> {
    decision: &'a StepDecision,
    failure: &'a AttemptFailure,
    /// The attempt's failure facts (category, class, code).
    facts: StepFailure,
}

fn attempt_record(
    attempt: u32,
    budget: Budget,
    report: &AttemptReport,
    decided: Option<Decided<'_>>,
    settlement: Option<PolicySettlement>,
) -> AttemptRecord {
    let pf = report.provider_failure;
    let mut record = AttemptRecord {
        attempt,
        budget,
        status: AttemptStatus::Succeeded,
        started_at: report.started_at.clone(),
        provider_error_class: pf.map(|f| f.class),
        http_status: pf.and_then(|f| f.http_status),
        retry_after_ms: pf.and_then(|f| f.retry_after_ms),
        gateway: report.gateway.clone(),
        failure_category: None,
        failure_class: None,
        code: None,
        message: report.message.clone(),
        answer_excerpt: report.answer_excerpt.clone(),
        answer_bytes: report.answer_bytes,
        timeout_kind: None,
        output_constraint: report.output_constraint,
        grounding: report.grounding.clone(),
        retry_rule: None,
        retry: Retry {
            decision: RetryDecision::None,
        },
        wait_ms: None,
        write_settlement: None,
        write_restore: None,
        files_written: Some(report.written.iter().map(WrittenFile::record).collect()),
        usage: report.usage,
        cost_usd: report.cost_usd,
        duration_ms: report.duration_ms,
        lease: report.lease.clone(),
        turns: report.turns.clone(),
    };
    let Some(Decided {
        decision,
        failure,
        facts,
    }) = decided
    else {
        return record;
    };
    record.status = if matches!(failure, AttemptFailure::Cancelled) {
        AttemptStatus::Cancelled
    } else {
        AttemptStatus::Failed
    };
    record.retry = Retry {
        decision: decision.retry_decision(),
    };
    record.retry_rule = Some(decision.retry_rule().to_owned());
    record.wait_ms = decision.wait_ms();
    record.timeout_kind = decision.timeout_kind();
    record.write_settlement = settlement.map(PolicySettlement::recorded);
    record.failure_category = Some(facts.category);
    record.failure_class = Some(facts.failure_class);
    record.code = Some(facts.code);
    record
}
