#!/usr/bin/env python3
"""Soak of `docsfab serve` on PostgreSQL with real processes (docs/scale-out.md, "Soak").

W `docsfab serve` workers (--jobs J each) share one fresh database; C concurrent clients submit
N two-step jobs with `resume: auto` through `POST /api/runs` (each keeping a window of jobs in
flight, polling `GET /api/runs/{id}`) against `docsfab sim serve`, whose script answers after a
short wait with a 429, a 503, a 502 and a stream cut mid-body among every 52 requests. Once a
quarter of the jobs are in and worker 0 runs some, it is killed with SIGKILL and started again;
as soon as the first of its runs is marked interrupted (or --restart-after-kill seconds after the
kill), PostgreSQL is restarted with a fast shutdown (`pg_ctl -m fast restart`).

Checked, and the script exits 1 when any fails:
  - every job ends succeeded, or is one of the killed worker's runs, `interrupted`, with exactly
    one resume (its spec's resumeFrom), which succeeded; no other run is interrupted;
  - every run was claimed exactly once (the "claimed run ID" lines of every worker's log, the
    killed one's included);
  - every record's steps are there once, each step's attempts are numbered 1, 2, ... without a
    gap and no two overlap in time;
  - every request the simulator served is in a record, but for those of the attempts the kill
    cut short.
Printed: jobs per second, submit and poll latency (p50, p99), time from the kill to the runs
being interrupted, to their resumes being claimed and ended, peak PostgreSQL connections of the
database (pg_stat_activity, sampled every 0.5 s, the script's own sessions left out) and peak
RSS of each worker (VmHWM).

Only the standard library, `psql` and `pg_ctl`; usage (pg_ctl runs as the data directory's
owner when the script runs as root):
  scripts/soak-serve/soak.py --docsfab target/release/docsfab \\
      --postgres postgres://postgres@127.0.0.1:5432/postgres \\
      --pgctl /usr/lib/postgresql/15/bin/pg_ctl --pgdata /path/to/data \\
      [--jobs 1000] [--clients 20] [--workers 4] [--jobs-per-worker 4] [--window 3] \\
      [--heartbeat-ms 200] [--delay-ms 120] [--restart-after-kill SECONDS] [--keep]
The figures go to stdout, progress to stderr; the temporary directory (worker logs) and the
database are kept when a check fails or with --keep.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request

COMPOSITION = """name: soak
limits:
  timeoutMs: 600000
  maxTurns: 6
steps:
  - id: survey
    access: read-only
    instructions: Survey the code.
    contract:
      schema: {type: object, required: [modules]}
  - id: outline
    access: read-only
    instructions: "Outline {{steps.survey.output}}."
    contract:
      schema: {type: object, required: [modules]}
"""


def scenario(delay_ms):
    ok = f"  - answer: {{json: {{modules: [core]}}}}\n    delay_ms: {delay_ms}\n    repeat: 12\n"
    return ("responses:\n" + ok
            + "  - status: 429\n    headers: {retry-after-ms: \"50\"}\n" + ok
            + "  - status: 503\n" + ok
            + "  - answer: {json: {modules: [core, cli, docs, tests, bench]}}\n"
              "    cut: {after_bytes: 60, with: reset}\n" + ok
            + "  - status: 502\nfallback: cycle\n")


def http(method, url, body=None, timeout=60):
    """(status, JSON answer); status 0 when the server could not be reached."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError):
        return 0, None


APP = "docsfab-soak"


def psql(url, sql):
    # Named, so that the connection count leaves the script's own sessions out.
    out = subprocess.run(["psql", url, "-XAtqF", "\t", "-c", sql], capture_output=True, text=True,
                         env=dict(os.environ, PGAPPNAME=APP))
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return [line.split("\t") for line in out.stdout.splitlines() if line]


def psql_retry(url, sql, tries=150):
    """A query asked again while the server restarts."""
    for _ in range(tries):
        try:
            return psql(url, sql)
        except RuntimeError:
            time.sleep(0.2)
    return psql(url, sql)


def pct(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    return values[round(p / 100 * (len(values) - 1))]


def peak_rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Workers:
    """The `docsfab serve` processes, by slot; a killed one is started again in its slot."""

    def __init__(self, args, env, tmp, store):
        self.args, self.env, self.tmp, self.store = args, env, tmp, store
        self.procs, self.addrs, self.generation = [], [], 0
        self.lock = threading.Lock()
        for slot in range(args.workers):
            p, addr = self.spawn(slot)
            self.procs.append(p)
            self.addrs.append(addr)

    def spawn(self, slot):
        self.generation += 1
        home = os.path.join(self.tmp, f"w{slot}")
        os.makedirs(home, exist_ok=True)
        shutil.copy(os.path.join(self.tmp, "home", "host.yaml"), home)
        log = open(os.path.join(self.tmp, "logs", f"w{slot}-{self.generation}.log"), "w")
        env = dict(self.env, DOCSFAB_HOME=home)
        p = subprocess.Popen([self.args.docsfab, "--store", self.store, "serve", "--listen",
                              "127.0.0.1:0", "--jobs", str(self.args.jobs_per_worker),
                              "--workspace-root", self.tmp],
                             stdout=subprocess.PIPE, stderr=log, env=env)
        line = p.stdout.readline().decode().strip()
        if not line.startswith("listening on "):
            raise SystemExit(f"unexpected first line from serve: {line!r}")
        return p, line[len("listening on "):]

    def addr(self, turn):
        with self.lock:
            return self.addrs[turn % len(self.addrs)]

    def kill_and_restart(self, slot):
        """SIGKILL, then the same slot again; returns (kill time, the killed pid, its peak RSS)."""
        victim = self.procs[slot]
        rss = peak_rss_mib(victim.pid)
        victim.kill()
        victim.wait()
        killed = time.time()
        p, addr = self.spawn(slot)
        with self.lock:
            self.procs[slot], self.addrs[slot] = p, addr
        return killed, victim.pid, rss

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait()


def client(n, count, args, workers, ws, out, submitted):
    body = {"composition": COMPOSITION, "workspace": {"path": ws}, "resume": "auto"}
    ids, submit_ms, poll_ms, errors, open_, turn = [], [], [], 0, [], n
    while len(ids) < count or open_:
        while len(open_) < args.window and len(ids) < count:
            addr, turn = workers.addr(turn), turn + 1
            t = time.monotonic()
            status, answer = http("POST", f"{addr}/api/runs", body)
            if status == 202:
                submit_ms.append((time.monotonic() - t) * 1000)
                ids.append(answer["runId"])
                open_.append(answer["runId"])
                with submitted[1]:
                    submitted[0] += 1
            else:
                errors += 1
                time.sleep(0.1)
        still = []
        for rid in open_:
            addr, turn = workers.addr(turn), turn + 1
            t = time.monotonic()
            status, record = http("GET", f"{addr}/api/runs/{rid}")
            if status == 200:
                poll_ms.append((time.monotonic() - t) * 1000)
                if record["status"] in ("queued", "running"):
                    still.append(rid)
            else:
                still.append(rid)
        open_ = still
        time.sleep(0.05)
    out[n] = (ids, submit_ms, poll_ms, errors)


def restart_postgres(args):
    restart = (f'"{args.pgctl}" -D "{args.pgdata}" -l "{args.pgdata}/restart.log" '
               f'-m fast -w restart')
    t = time.monotonic()
    if os.getuid() == 0:
        owner = subprocess.run(["stat", "-c", "%U", args.pgdata], capture_output=True,
                               text=True, check=True).stdout.strip()
        subprocess.run(["su", owner, "-s", "/bin/sh", "-c", restart], check=True,
                       stdout=subprocess.DEVNULL)
    else:
        subprocess.run(["sh", "-c", restart], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def chaos(args, db, workers, submitted):
    """Kills worker 0 once it runs jobs and a quarter are in, starts it again, then restarts
    PostgreSQL. Returns what happened."""
    pid = workers.procs[0].pid
    until = time.monotonic() + 300
    while True:
        mine = psql_retry(db, "SELECT COUNT(*) FROM runs WHERE status = 'running' "
                              f"AND owner_worker LIKE '%/{pid}/%'")[0][0]
        if int(mine) > 0 and submitted[0] >= args.jobs // 4:
            break
        if time.monotonic() > until:
            raise SystemExit("soak: worker 0 ran no job once a quarter of the jobs were in")
        time.sleep(0.2)
    killed, victim, rss = workers.kill_and_restart(0)
    print(f"killed worker 0 (pid {victim}) with SIGKILL, started it again", file=sys.stderr)
    if args.restart_after_kill is not None:
        time.sleep(max(0.0, killed + args.restart_after_kill - time.time()))
    else:
        until = time.monotonic() + 120
        while int(psql_retry(db, "SELECT COUNT(*) FROM runs WHERE status = 'interrupted'")[0][0]) == 0:
            if time.monotonic() > until:
                raise SystemExit("soak: no run was interrupted within 120 s of the kill")
            time.sleep(0.1)
    took = restart_postgres(args)
    print(f"restarted PostgreSQL (pg_ctl -m fast restart, {took:.1f} s)", file=sys.stderr)
    return {"killed": killed, "victim": victim, "victim_rss": rss, "restart_s": took}


def sample_connections(admin, name, peak, stop):
    while not stop.is_set():
        try:
            n = int(psql(admin, "SELECT COUNT(*) FROM pg_stat_activity "
                                f"WHERE datname = '{name}' AND application_name <> '{APP}'")[0][0])
            peak[0] = max(peak[0], n)
        except (RuntimeError, IndexError, ValueError):
            pass
        stop.wait(0.5)


def record_ms(text):
    """Milliseconds since the epoch of a record time (2026-12-01T20:19:12.123Z)."""
    import calendar
    base = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    return base * 1000 + (int(text[20:23]) if len(text) > 20 else 0)


def check_record(r, problems):
    steps = r["steps"]
    if r["status"] == "succeeded" and len(steps) != 2:
        problems.append(f"run {r['runId']} has {len(steps)} steps (claimed twice?)")
    for step in steps:
        free_from = None
        for i, a in enumerate(step["attempts"]):
            if a["attempt"] != i + 1:
                problems.append(f"run {r['runId']} step {step['stepId']}: attempt {i + 1} missing")
            start = record_ms(a["startedAt"])
            if free_from is not None and start + 1 < free_from:
                problems.append(f"run {r['runId']} step {step['stepId']}: attempts overlap")
            free_from = start + a["durationMs"]
        if r["status"] == "succeeded":
            last = step["attempts"][-1] if step["attempts"] else None
            if step["status"] != "succeeded":
                problems.append(f"run {r['runId']} succeeded with step {step['stepId']} "
                                f"{step['status']}")
            elif last is None and not step.get("reusedFrom"):
                problems.append(f"run {r['runId']} step {step['stepId']}: no attempt, not reused")
            elif last is not None and last["status"] != "succeeded":
                problems.append(f"run {r['runId']} step {step['stepId']}: last attempt "
                                f"{last['status']}")


def requests_in(r):
    return sum(1 + len(t.get("replays") or []) for s in r["steps"] for a in s["attempts"]
               for t in a["turns"])


# ---- The soak ---------------------------------------------------------------------------------

KEY_VAR, SECRET = "DOCSFAB_SOAK_PROVIDER_KEY", "sk-soak-SECRET-0042"
FAST_CATALOG = ("catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 50\n"
                "  providerAttempt.maxTotalDelayMs: 200\n")


def start_sim(args, tmp):
    """`docsfab sim serve` with the faulty script, logging every request; (process, base URL,
    request log)."""
    scen, log = os.path.join(tmp, "scenario.yaml"), os.path.join(tmp, "sim.jsonl")
    with open(scen, "w") as f:
        f.write(scenario(args.delay_ms))
    p = subprocess.Popen([args.docsfab, "sim", "serve", "--listen", "127.0.0.1:0", "--scenario",
                          scen, "--log", log], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = p.stdout.readline().decode().strip()
    if not line.startswith("listening on "):
        raise SystemExit(f"unexpected first line from sim serve: {line!r}")
    return p, line[len("listening on "):], log


def write_setup(tmp, base_url):
    """home/host.yaml (provider "default" at the simulator, replay waits in milliseconds) and a
    workspace ws/ with two source files; returns the workspace."""
    home, ws = os.path.join(tmp, "home"), os.path.join(tmp, "ws")
    os.makedirs(home)
    os.makedirs(os.path.join(ws, "src"))
    os.makedirs(os.path.join(tmp, "logs"))
    with open(os.path.join(home, "host.yaml"), "w") as f:
        f.write(f"providers:\n  default:\n    api: openai-chat\n    baseUrl: {base_url}\n"
                f"    apiKeyEnv: {KEY_VAR}\n    model: sim-model\n{FAST_CATALOG}")
    with open(os.path.join(ws, "src", "lib.rs"), "w") as f:
        f.write("//! A tiny crate.\npub mod count;\n")
    with open(os.path.join(ws, "src", "count.rs"), "w") as f:
        f.write("pub fn count() -> usize { 3 }\n")
    return ws


def fresh_database(admin):
    """A new database beside the admin URL's; (its name, its URL)."""
    name = f"soak_{os.getpid()}_{int(time.time())}"
    psql(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    psql(admin, f"CREATE DATABASE {name}")
    base, _, rest = admin.rpartition("/")
    query = rest[rest.index("?"):] if "?" in rest else ""
    return name, f"{base}/{name}{query}"


def wait_until(seconds, what, done):
    until = time.monotonic() + seconds
    while not done():
        if time.monotonic() > until:
            raise SystemExit(f"soak: timed out waiting for {what}")
        time.sleep(0.2)


def runs_table(db):
    """(run id, status, owner, run it resumes, started ms, ended ms), in queue order."""
    rows = psql_retry(db, "SELECT run_id, status, COALESCE(owner_worker, ''), "
                          "COALESCE(job_spec::jsonb -> 'resumeFrom' ->> 'runId', ''), "
                          "started_ms, COALESCE(ended_ms::text, '') FROM runs ORDER BY queued_seq")
    return [(r[0], r[1], r[2] or None, r[3] or None, int(r[4]), int(r[5]) if r[5] else None)
            for r in rows]


def check_outcomes(rows, ids, victim_pid, record, problems):
    """Every run succeeded, or was the killed worker's and is interrupted with exactly one
    resume, which succeeded; every submitted job is there. Returns (interrupted, resume) pairs."""
    by_id = {r[0]: r for r in rows}
    for rid in ids:
        if rid not in by_id:
            problems.append(f"submitted run {rid} is not in the store")
    resumes = {}
    for r in rows:
        if r[3]:
            resumes.setdefault(r[3], []).append(r[0])
    victim, pairs = f"/{victim_pid}/", []
    for rid, status, owner, resume_of, _, _ in rows:
        if status == "succeeded":
            continue
        if status == "interrupted":
            if victim not in (owner or ""):
                problems.append(f"run {rid} of a live worker ({owner}) was interrupted")
            if resume_of:
                problems.append(f"the resume {rid} (of {resume_of}) was interrupted")
            found = resumes.get(rid, [])
            if len(found) != 1:
                problems.append(f"run {rid} was resumed {len(found)} times: {found}")
            elif by_id[found[0]][1] != "succeeded":
                problems.append(f"the resume of {rid}, {found[0]}, is {by_id[found[0]][1]}")
            else:
                pairs.append((rid, found[0]))
            continue
        r = record(rid) or {}
        reasons = [s.get("endReason") for s in r.get("steps", [])]
        problems.append(f"run {rid} (owner {owner}) ended {status}: {r.get('endReason')!r} "
                        f"(steps: {reasons})")
    for origin, found in resumes.items():
        if by_id.get(origin, (None, None))[1] != "interrupted":
            problems.append(f"run {origin} was resumed but is {by_id.get(origin)}")
    if not any(r[1] == "interrupted" for r in rows):
        problems.append("the kill interrupted no run: the soak proved nothing")
    return pairs


def check_claims(rows, logs, problems):
    """Each run that left the queue was claimed exactly once, over every worker's log."""
    text = ""
    for name in sorted(os.listdir(logs)):
        with open(os.path.join(logs, name), errors="replace") as f:
            text += f.read()
    for r in rows:
        n = text.count(f"claimed run {r[0]}\n")
        if n != 1:
            problems.append(f"run {r[0]} was claimed {n} times")


def summary(values):
    """min / median / max of a list of milliseconds, or the list itself when short."""
    if not values:
        return "none"
    if len(values) <= 8:
        return "[" + ", ".join(str(v) for v in values) + "]"
    return f"min {min(values)} median {statistics.median(values):.0f} max {max(values)} (n={len(values)})"


def report(args, m, wall, rows, pairs, chaos_done, peak_conns, rss, logged, accounted):
    by_id = {r[0]: r for r in rows}
    killed = int(chaos_done["killed"] * 1000)
    interrupted = [by_id[a][5] - killed for a, _ in pairs]
    claimed = [by_id[b][4] - killed for _, b in pairs]
    ended = [by_id[b][5] - killed for _, b in pairs]
    owners = {r[2] for r in rows if r[2]}
    print(f"soak: {len(m['ids'])} jobs by {args.clients} clients on {args.workers} workers "
          f"(--jobs {args.jobs_per_worker}), {len(rows)} runs in {wall:.1f} s = "
          f"{len(m['ids']) / wall:.1f} jobs/s; {len(pairs)} resumed; "
          f"{m['errors']} submissions retried; owners seen {len(owners)}")
    print(f"submit p50 {pct(m['submit'], 50):.1f} ms p99 {pct(m['submit'], 99):.1f} ms; "
          f"poll p50 {pct(m['poll'], 50):.1f} ms p99 {pct(m['poll'], 99):.1f} ms "
          f"({len(m['submit'])} submissions, {len(m['poll'])} polls)")
    print(f"kill -9 of worker 0 (pid {chaos_done['victim']}) to runs interrupted (ms): "
          f"{summary(interrupted)}; to resumes claimed: {summary(claimed)}; "
          f"to resumes ended: {summary(ended)}")
    print(f"PostgreSQL restart (pg_ctl -m fast restart): {chaos_done['restart_s']:.1f} s, "
          f"done {(chaos_done['restarted_at'] - chaos_done['killed']):.1f} s after the kill")
    print(f"peak PostgreSQL connections of the database: {peak_conns}")
    print("peak RSS (VmHWM, MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in rss))
    print(f"provider requests: {logged} served by the simulator, {accounted} in records")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docsfab", required=True)
    ap.add_argument("--postgres", required=True, help="admin URL; a fresh database is made")
    ap.add_argument("--pgctl", required=True, help="the pg_ctl of that server")
    ap.add_argument("--pgdata", required=True, help="that server's data directory")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--jobs-per-worker", type=int, default=4)
    ap.add_argument("--window", type=int, default=3, help="jobs each client keeps in flight")
    ap.add_argument("--delay-ms", type=int, default=120, help="the simulator's answer delay")
    ap.add_argument("--heartbeat-ms", type=int, default=200, help="DOCSFAB_HEARTBEAT_MS")
    ap.add_argument("--restart-after-kill", type=float, default=None,
                    help="restart PostgreSQL this many seconds after the kill instead of "
                         "when the first run is interrupted")
    ap.add_argument("--keep", action="store_true", help="keep the directory and database")
    args = ap.parse_args()
    if args.workers < 2 or args.jobs < args.clients:
        raise SystemExit("soak: needs at least 2 workers and a job per client")
    args.docsfab = os.path.abspath(args.docsfab)

    tmp = tempfile.mkdtemp(prefix="docsfab-soak-")
    dbname, db = fresh_database(args.postgres)
    sim, base_url, sim_log = start_sim(args, tmp)
    ws = write_setup(tmp, base_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCSFAB_")}
    env.update({KEY_VAR: SECRET, "DOCSFAB_RETRY_BASE_DELAY_MS": "20",
                "DOCSFAB_HEARTBEAT_MS": str(args.heartbeat_ms)})
    workers, problems, finished = None, [], False
    stop_sampling, peak_conns = threading.Event(), [0]
    print(f"soak: {tmp}, database {dbname}", file=sys.stderr)
    try:
        workers = Workers(args, env, tmp, db)
        sampler = threading.Thread(target=sample_connections,
                                   args=(args.postgres, dbname, peak_conns, stop_sampling),
                                   daemon=True)
        sampler.start()
        submitted, out = [0, threading.Lock()], {}
        started = time.monotonic()
        clients = []
        for n in range(args.clients):
            count = args.jobs // args.clients + (1 if n < args.jobs % args.clients else 0)
            t = threading.Thread(target=client, args=(n, count, args, workers, ws, out, submitted),
                                 daemon=True)
            t.start()
            clients.append(t)
        chaos_done = chaos(args, db, workers, submitted)
        chaos_done["restarted_at"] = time.time()
        for t in clients:
            t.join()
        if len(out) != args.clients:
            raise SystemExit("soak: a client stopped unexpectedly")
        m = {"ids": [], "submit": [], "poll": [], "errors": 0}
        for ids, submit_ms, poll_ms, errors in out.values():
            m["ids"] += ids
            m["submit"] += submit_ms
            m["poll"] += poll_ms
            m["errors"] += errors
        wait_until(300, "every run (resumes too) to end", lambda: int(psql_retry(
            db, "SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')")[0][0]) == 0)
        wall = time.monotonic() - started
        stop_sampling.set()

        rows = runs_table(db)

        def record(rid):
            status, r = http("GET", f"{workers.addr(1)}/api/runs/{rid}")
            return r if status == 200 else None

        pairs = check_outcomes(rows, m["ids"], chaos_done["victim"], record, problems)
        check_claims(rows, os.path.join(tmp, "logs"), problems)
        records = []
        for r in rows:
            rec = record(r[0])
            if rec is None:
                problems.append(f"the record of run {r[0]} could not be read")
                continue
            records.append(rec)
            check_record(rec, problems)
        accounted = sum(requests_in(r) for r in records)
        with open(sim_log) as f:
            logged = sum(1 for _ in f)
        # The attempts the kill cut short are in no record; every other request is.
        if not (accounted <= logged and logged - accounted <= 10 * max(len(pairs), 1)):
            problems.append(f"the simulator served {logged} requests, the records account "
                            f"for {accounted}")
        rss = [("w0 (killed)", chaos_done["victim_rss"])]
        rss += [(f"w{i}" + (" (restarted)" if i == 0 else ""), peak_rss_mib(p.pid))
                for i, p in enumerate(workers.procs)]
        report(args, m, wall, rows, pairs, chaos_done, peak_conns[0], rss, logged, accounted)
        finished = True
    finally:
        stop_sampling.set()
        if workers is not None:
            workers.stop()
        sim.terminate()
        sim.wait()
        if not finished:
            print(f"soak: stopped early (logs kept in {tmp}/logs, database {dbname})",
                  file=sys.stderr)
        elif not args.keep and not problems:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                psql_retry(args.postgres, f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)",
                           tries=25)
            except RuntimeError as e:
                print(f"soak: could not drop {dbname}: {e}", file=sys.stderr)
    if problems:
        print(f"soak: {len(problems)} checks failed (logs kept in {tmp}/logs, database "
              f"{dbname}):", file=sys.stderr)
        for p in problems[:50]:
            print(f"  - {p}", file=sys.stderr)
        sys.exit(1)
    print("soak: every check passed")


if __name__ == "__main__":
    main()
