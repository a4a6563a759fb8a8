// docsfab run report: draws the embedded run record. Every text from the record goes into the
// page through textContent or an attribute value, never as markup: the record holds model text.
(function () {
  'use strict';
  var started = performance.now();
  var record = JSON.parse(document.getElementById('run-record').textContent);
  var diffs = JSON.parse(document.getElementById('run-diffs').textContent);
  var gatewayBlock = document.getElementById('run-gateway');
  var gateway = gatewayBlock ? JSON.parse(gatewayBlock.textContent) : null;
  var LABEL = 190;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function num(v) { return typeof v === 'number' && isFinite(v) ? v : null; }
  function ms(v) {
    if (v === null || v === undefined) return '-';
    if (v < 1000) return Math.round(v) + ' ms';
    if (v < 60000) return (v / 1000).toFixed(v < 10000 ? 2 : 1) + ' s';
    var m = Math.floor(v / 60000), s = Math.round((v % 60000) / 1000);
    if (m < 60) return m + 'm ' + (s < 10 ? '0' : '') + s + 's';
    return Math.floor(m / 60) + 'h ' + (m % 60) + 'm';
  }
  function cls(v) { return String(v).replace(/[^a-z0-9-]/gi, '_'); }
  // Unknown counts (null) read as unknown, never as 0: unknown is not free.
  function count(n) { return n === null || n === undefined ? 'unknown' : String(n); }
  function usage(u) {
    if (!u) return '-';
    var text = (u.inputTokens == null && u.outputTokens == null) ? 'tokens unknown'
      : count(u.inputTokens) + ' in / ' + count(u.outputTokens) + ' out';
    if (u.cacheReadTokens || u.cacheWriteTokens) text += ' (cache read ' + (u.cacheReadTokens || 0) + ', write ' + (u.cacheWriteTokens || 0) + ')';
    if (u.estimated) text += ' (estimated)';
    return text;
  }
  function cost(c) { return typeof c === 'number' ? '$' + c.toFixed(6) : 'cost unknown'; }

  // ---- figures shared by the header and the timeline ----
  var runStart = Date.parse(record.startedAt);
  var attempts = []; // {step, a, start, end}
  var cursor = 0;
  record.steps.forEach(function (s) {
    (s.attempts || []).forEach(function (a) {
      var start = Date.parse(a.startedAt) - runStart;
      if (!isFinite(start)) start = cursor; // an old record without startedAt: one after another
      var end = start + (num(a.durationMs) || 0);
      cursor = end + (num(a.waitMs) || 0);
      attempts.push({ step: s, a: a, start: start, end: end });
    });
  });
  var runEnd = record.endedAt ? Date.parse(record.endedAt) - runStart : null;
  var total = runEnd || 0;
  attempts.forEach(function (x) { total = Math.max(total, x.end, x.end + (num(x.a.waitMs) || 0)); });
  total = Math.max(total, 1);

  // ---- header ----
  function header() {
    var dl = document.getElementById('run-facts');
    var p = record.provider;
    var facts = [
      ['composition', record.composition],
      ['status', record.status, 'st-' + cls(record.status)],
      ['run', record.runId],
      ['started', record.startedAt],
      ['duration', runEnd === null ? 'still running' : ms(runEnd)],
      ['tokens', usage(record.usage)],
      ['cost', cost(record.costUsd)],
      ['provider', p ? p.name + ' (' + p.api + ', ' + p.host + ')' : 'not recorded'],
      ['model', record.model || 'not recorded'],
      ['docsfab', record.docsfabVersion || 'not recorded'],
      ['workspace', record.workspace || 'not recorded'],
      ['steps', record.steps.length],
      ['attempts', attempts.length]
    ];
    // Only when the steps cannot say why the run ended (it never started, it was cancelled
    // while queued, its process died): one sentence, shown as text.
    if (record.endReason) facts.splice(2, 0, ['why it ended', record.endReason]);
    // The lineage (docs/resume.md): the run this one resumed, and each step carried over.
    if (record.resumedFrom) facts.push(['resumed from', 'run ' + record.resumedFrom.runId]);
    record.steps.forEach(function (s) {
      if (s.reusedFrom) {
        facts.push(['reused ' + s.stepId, 'from run ' + s.reusedFrom.runId + ' (' +
          s.reusedFrom.stepId + '): inputs unchanged, no request sent']);
      }
    });
    // Once per run: the gateway the attempts came through and the rules it may have bent.
    if (gateway) {
      facts.push(['gateway', gateway.gateway + ' (' + gateway.attempts + ' of ' + gateway.of +
        ' attempts came through it)']);
      gateway.mayHaveBent.forEach(function (b) {
        facts.push(['may have bent ' + b.rule, b.what]);
      });
    }
    facts.forEach(function (f) {
      dl.appendChild(el('dt', null, f[0]));
      dl.appendChild(el('dd', f[2] || null, f[1]));
    });
  }

  // ---- legend ----
  function legend() {
    var lg = document.getElementById('legend');
    function item(swCls, text) {
      var s = el('span');
      s.appendChild(el('span', 'sw ' + swCls));
      s.appendChild(document.createTextNode(text));
      lg.appendChild(s);
    }
    item('b-initial', 'initial attempt');
    item('b-transport', 'transport retry');
    item('b-contract', 'contract retry');
    item('s-failed b-initial', 'failed (striped, red ring)');
    item('s-cancelled b-initial', 'cancelled');
    item('mark-sw', 'replay within a turn');
    item('wait-sw', 'wait before the next attempt');
    item('held-sw', 'throttle hold');
    var zoom = el('label', null, 'zoom ');
    var input = document.createElement('input');
    input.type = 'range'; input.min = '1'; input.max = '64'; input.value = '1'; input.id = 'zoom';
    zoom.appendChild(input);
    lg.appendChild(zoom);
    return input;
  }

  // ---- tooltips: one text per attempt, turn, replay and wait ----
  function replayText(r, i) {
    var what = r.status !== undefined && r.status !== null ? 'HTTP ' + r.status : (r.fault || '?');
    var t = 'replay ' + (i + 1) + ': ' + what;
    if (r.providerErrorClass) t += ' (' + r.providerErrorClass + ')';
    t += ', waited ' + ms(r.waitMs);
    if (num(r.retryAfterMs) !== null) t += ', Retry-After ' + ms(r.retryAfterMs);
    return t;
  }
  function toolsText(turns) {
    var counts = {};
    turns.forEach(function (t) {
      ((t.toolBatch && t.toolBatch.calls) || []).forEach(function (c) {
        var k = c.tool + (c.outcome === 'executed' ? '' : ' (' + c.outcome + ')');
        counts[k] = (counts[k] || 0) + 1;
      });
    });
    var keys = Object.keys(counts);
    return keys.length ? keys.map(function (k) { return k + ' x' + counts[k]; }).join(', ') : 'none';
  }
  function attemptText(x) {
    var a = x.a, turns = a.turns || [];
    var replays = turns.reduce(function (n, t) { return n + (t.replays || []).length; }, 0);
    var lines = [
      x.step.stepId + ' attempt ' + a.attempt + ' (' + a.budget + ' budget): ' + a.status,
      'started at +' + ms(x.start) + ', took ' + ms(a.durationMs)
    ];
    if (a.failureClass || a.code) {
      lines.push('failure: ' + (a.failureClass || '-') + ' / ' + (a.code || '-') +
        (a.providerErrorClass ? ' (provider: ' + a.providerErrorClass + ')' : ''));
    }
    if (num(a.httpStatus) !== null || num(a.retryAfterMs) !== null) {
      lines.push('HTTP ' + (a.httpStatus === null ? '-' : a.httpStatus) + ', Retry-After ' + ms(a.retryAfterMs));
    }
    lines.push('rule: ' + (a.retryRule || '-') + ', decision: ' + a.retryDecision +
      (num(a.waitMs) !== null ? ', wait ' + ms(a.waitMs) : ''));
    lines.push('usage: ' + usage(a.usage) + ', ' + cost(a.costUsd));
    lines.push('turns: ' + turns.length + ', replays: ' + replays + ', tools: ' + toolsText(turns));
    if (a.lease) lines.push('stop: ' + a.lease.stopReason);
    if (a.grounding) lines.push(groundingText(a.grounding));
    return lines.join('\n');
  }
  // What a judged answer cited (record `grounding`, docs/grounding.md).
  function groundingText(g) {
    return 'grounding: ' + g.grounded + ' of ' + g.cited + ' cited grounded' +
      (g.external ? ', ' + g.external + ' external' : '') +
      (g.unknown.length ? ', ' + g.unknown.length + ' unknown' : '');
  }
  function unknownText(u) {
    return u.kind + ' ' + u.text + ' in ' + u.member + ', line ' + u.line +
      (u.nearest && u.nearest.length ? ' (nearest: ' + u.nearest.join(', ') + ')' : '');
  }
  function turnText(t) {
    var lines = ['turn ' + t.turn + ': ' + t.status + ', ' + usage(t.usage)];
    if (num(t.durationMs) !== null) lines.push('took ' + ms(t.durationMs));
    if (num(t.heldMs)) lines.push('throttle hold ' + ms(t.heldMs));
    (t.replays || []).forEach(function (r, i) { lines.push(replayText(r, i)); });
    var b = t.toolBatch;
    if (b && b.requested) lines.push('tools: ' + b.requested + ' requested, ' + b.executed + ' executed, ' + b.rejected + ' rejected');
    if (t.reason) lines.push('reason: ' + t.reason);
    (t.warnings || []).forEach(function (w) { lines.push(warningText(w)); });
    return lines.join('\n');
  }
  // A turn warning (record `warnings`): it decided nothing, but an operator should look.
  function warningText(w) {
    if (w.kind === 'prompt-truncated') {
      return 'warning: the provider counted ' + w.inputTokens + ' prompt tokens for a ' + w.sentBytes +
        '-byte request; it probably cut the prompt to its context window';
    }
    return 'warning: ' + w.kind;
  }

  // ---- timeline ----
  function pct(v) { return (v / total * 100) + '%'; }
  function drawTurns(bar, a) {
    var turns = a.turns || [];
    if (!turns.length) return;
    // Turns are drawn to scale when the record gives their durations; otherwise in equal parts.
    var known = turns.every(function (t) { return num(t.durationMs) !== null; });
    var sum = known ? turns.reduce(function (n, t) { return n + t.durationMs; }, 0) : 0;
    var weights = turns.map(function (t) { return sum > 0 ? t.durationMs / sum : 1 / turns.length; });
    var left = 0;
    turns.forEach(function (t, i) {
      var d = el('div', 'turn t-' + cls(t.status));
      d.style.left = (left * 100) + '%';
      d.style.width = (weights[i] * 100) + '%';
      d.title = turnText(t);
      d.setAttribute('data-turn', String(t.turn));
      var held = num(t.heldMs);
      if (held && known && t.durationMs > 0) {
        var h = el('div', 'mark held');
        h.style.left = '0';
        h.style.width = Math.min(100, held / t.durationMs * 100) + '%';
        h.title = 'throttle hold: ' + ms(held);
        d.appendChild(h);
      } else if (held) {
        var h2 = el('div', 'mark held');
        h2.style.left = '0'; h2.style.width = '3px';
        h2.title = 'throttle hold: ' + ms(held);
        d.appendChild(h2);
      }
      var replays = t.replays || [];
      var waited = 0;
      replays.forEach(function (r, j) {
        waited += num(r.waitMs) || 0;
        // A replay goes out after its wait: placed by the waits when the turn's length is known.
        var at = known && t.durationMs > 0 ? Math.min(1, waited / t.durationMs) : (j + 1) / (replays.length + 1);
        var m = el('div', 'mark replay c-' + cls(r.providerErrorClass || 'unknown'));
        m.style.left = (at * 100) + '%';
        m.title = replayText(r, j);
        m.setAttribute('data-replay', String(j + 1));
        d.appendChild(m);
      });
      bar.appendChild(d);
      left += weights[i];
    });
  }
  function ticks(container) {
    var raw = total / 10, pow = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (k) { return k * pow; }).filter(function (s) { return s >= raw; })[0];
    for (var t = 0; t <= total; t += step) {
      var tk = el('div', 'tick', t === 0 ? '0' : ms(t));
      tk.style.left = pct(t);
      container.appendChild(tk);
    }
  }
  function timeline(onSelect) {
    var box = document.getElementById('timeline');
    var inner = el('div', 'inner');
    var axis = el('div', 'axis');
    axis.appendChild(el('div', 'lane-label', 'step / time from start'));
    var tk = el('div', 'ticks');
    ticks(tk);
    axis.appendChild(tk);
    inner.appendChild(axis);
    var byStep = new Map();
    attempts.forEach(function (x, i) {
      if (!byStep.has(x.step)) byStep.set(x.step, []);
      byStep.get(x.step).push(i);
    });
    var frag = document.createDocumentFragment();
    record.steps.forEach(function (s) {
      var lane = el('div', 'lane');
      lane.setAttribute('data-step', s.stepId);
      var label = el('div', 'lane-label' + (s.forEach ? ' instance' : ''), s.stepId);
      label.title = s.stepId + ': ' + s.status + (s.forEach ? '\nitem: ' + JSON.stringify(s.forEach.item) : '') +
        (s.failure ? '\n' + s.failure.code + ': ' + s.failure.message : '');
      lane.appendChild(label);
      var track = el('div', 'track');
      (byStep.get(s) || []).forEach(function (i) {
        var x = attempts[i], a = x.a;
        var bar = el('div', 'attempt b-' + cls(a.budget) + ' s-' + cls(a.status));
        bar.style.left = pct(x.start);
        bar.style.width = pct(x.end - x.start);
        bar.setAttribute('data-attempt', s.stepId + '#' + a.attempt);
        bar.setAttribute('data-index', String(i));
        bar.title = attemptText(x);
        drawTurns(bar, a);
        track.appendChild(bar);
        var w = num(a.waitMs);
        if (w !== null) {
          var wait = el('div', 'wait');
          wait.style.left = pct(x.end);
          wait.style.width = pct(w);
          wait.title = 'wait ' + ms(w) + ' before attempt ' + (a.attempt + 1) + ' (rule ' + (a.retryRule || '-') + ')';
          wait.setAttribute('data-wait', s.stepId + '#' + a.attempt);
          track.appendChild(wait);
        }
      });
      lane.appendChild(track);
      frag.appendChild(lane);
    });
    inner.appendChild(frag);
    box.appendChild(inner);
    if (record.steps.length < 20) box.className = 'short';
    function select(bar) {
      var prev = box.querySelector('.attempt.selected');
      if (prev) prev.classList.remove('selected');
      bar.classList.add('selected');
      onSelect(attempts[Number(bar.getAttribute('data-index'))]);
    }
    box.addEventListener('click', function (ev) {
      var bar = ev.target.closest('[data-attempt]');
      if (bar) select(bar);
    });
    // `report.html#attempt=outline%231` opens with that attempt selected (links, screenshots).
    var wanted = /^#attempt=/.test(location.hash) ? decodeURIComponent(location.hash.slice(9)) : null;
    if (wanted) {
      var bars = box.querySelectorAll('.attempt');
      for (var b = 0; b < bars.length; b++) {
        if (bars[b].getAttribute('data-attempt') === wanted) { select(bars[b]); break; }
      }
    }
    return function setZoom(z) {
      var base = Math.max(box.clientWidth - LABEL - 2, 600);
      inner.style.width = (LABEL + base * z) + 'px';
    };
  }

  // ---- detail of the selected attempt ----
  function kvTable(rows) {
    var t = el('table', 'kv');
    rows.forEach(function (r) {
      var tr = el('tr');
      tr.appendChild(el('th', null, r[0]));
      tr.appendChild(el('td', null, r[1]));
      t.appendChild(tr);
    });
    return t;
  }
  function scalar(v) {
    if (v === null || v === undefined) return '-';
    return typeof v === 'object' ? JSON.stringify(v) : String(v);
  }
  function showDetail(x) {
    var box = document.getElementById('detail');
    box.textContent = '';
    var a = x.a;
    box.appendChild(el('h3', null, x.step.stepId + ', attempt ' + a.attempt));
    var rows = [['started', '+' + ms(x.start) + ' (' + a.startedAt + ')'], ['duration', ms(a.durationMs)]];
    var skip = { turns: 1, lease: 1, usage: 1, costUsd: 1, filesWritten: 1, answerExcerpt: 1, startedAt: 1, durationMs: 1, grounding: 1 };
    Object.keys(a).forEach(function (k) { if (!skip[k]) rows.push([k, scalar(a[k])]); });
    rows.push(['usage', usage(a.usage) + ', ' + cost(a.costUsd)]);
    if (a.lease) {
      var l = a.lease;
      rows.push(['lease', l.stopReason + ' / ' + l.disposition + ', ' + l.turnsUsed + ' of ' + l.maxTurns +
        ' turns, ' + l.executedToolCalls + ' tool calls ' + JSON.stringify(l.toolCounters || {}) +
        (l.evidence ? ', evidence: ' + l.evidence : '')]);
    }
    box.appendChild(kvTable(rows));
    var turns = a.turns || [];
    if (turns.length) {
      var t = el('table', 'turns');
      var head = el('tr');
      ['turn', 'status', 'usage', 'replays', 'tool calls', 'reason'].forEach(function (h) { head.appendChild(el('th', null, h)); });
      t.appendChild(head);
      turns.forEach(function (tu) {
        var tr = el('tr');
        tr.appendChild(el('td', null, tu.turn + (num(tu.durationMs) !== null ? ' (' + ms(tu.durationMs) + ')' : '')));
        tr.appendChild(el('td', null, tu.status + (num(tu.heldMs) ? ', held ' + ms(tu.heldMs) : '')));
        tr.appendChild(el('td', null, usage(tu.usage)));
        tr.appendChild(el('td', null, (tu.replays || []).map(replayText).join('\n') || '-'));
        var calls = ((tu.toolBatch && tu.toolBatch.calls) || []).map(function (c) {
          var rest = {};
          Object.keys(c).forEach(function (k) { if (k !== 'id' && k !== 'tool') rest[k] = c[k]; });
          return c.tool + ' ' + JSON.stringify(rest);
        });
        tr.appendChild(el('td', null, calls.join('\n') || '-'));
        var notes = (tu.reason ? [tu.reason] : []).concat((tu.warnings || []).map(warningText));
        tr.appendChild(el('td', null, notes.join('\n') || '-'));
        t.appendChild(tr);
      });
      box.appendChild(t);
    }
    if (a.filesWritten && a.filesWritten.length) {
      box.appendChild(el('div', 'muted', 'files written by this attempt:'));
      var ul = el('ul', 'files');
      a.filesWritten.forEach(function (f) { ul.appendChild(el('li', null, f.path + ' (' + f.bytes + ' bytes)')); });
      box.appendChild(ul);
    }
    if (a.grounding) {
      box.appendChild(el('div', 'muted grounding', groundingText(a.grounding)));
      if (a.grounding.unknown.length) {
        var unknown = el('ul', 'unknown');
        a.grounding.unknown.forEach(function (u) { unknown.appendChild(el('li', null, unknownText(u))); });
        box.appendChild(unknown);
      }
    }
    if (a.answerExcerpt !== null && a.answerExcerpt !== undefined) {
      box.appendChild(el('div', 'muted', 'answer (' + a.answerBytes + ' bytes in all):'));
      box.appendChild(el('pre', 'answer', a.answerExcerpt));
    }
  }

  // ---- files written, each linked to its part of the diff ----
  function files() {
    var box = document.getElementById('files');
    var diffIndex = {};
    diffs.forEach(function (d, i) { diffIndex[d.path] = i; });
    var seen = {}, list = [];
    attempts.forEach(function (x) {
      (x.a.filesWritten || []).forEach(function (f) {
        if (!seen[f.path]) { seen[f.path] = { path: f.path, by: [] }; list.push(seen[f.path]); }
        seen[f.path].by.push(x.step.stepId + '#' + x.a.attempt + ' ' + x.a.status);
        seen[f.path].bytes = f.bytes;
      });
    });
    diffs.forEach(function (d) { if (!seen[d.path]) { seen[d.path] = { path: d.path, by: [] }; list.push(seen[d.path]); } });
    if (!list.length) { box.appendChild(el('p', 'muted', 'The run wrote no files.')); return; }
    var ul = el('ul', 'files');
    list.forEach(function (f) {
      var li = el('li');
      if (diffIndex[f.path] !== undefined) {
        var a = el('a', null, f.path);
        a.href = '#diff-' + diffIndex[f.path];
        li.appendChild(a);
      } else {
        li.appendChild(el('span', null, f.path));
      }
      li.appendChild(el('span', 'muted', ' ' + (f.bytes !== undefined ? f.bytes + ' bytes, ' : '') + 'written by ' +
        (f.by.join(', ') || '-') + (diffIndex[f.path] === undefined ? '; not in the diff (no succeeded attempt kept it changed)' : '')));
      ul.appendChild(li);
    });
    box.appendChild(ul);
    diffs.forEach(function (d, i) {
      var h = el('h3', null, d.path);
      h.id = 'diff-' + i;
      box.appendChild(h);
      var pre = el('pre', 'diff');
      d.diff.split('\n').forEach(function (line, k, all) {
        if (k === all.length - 1 && line === '') return;
        var c = /^(\+\+\+|---) /.test(line) ? 'd-head' : line[0] === '+' ? 'd-add' : line[0] === '-' ? 'd-del' : line.slice(0, 2) === '@@' ? 'd-hunk' : null;
        var span = el('span', c, line + '\n');
        pre.appendChild(span);
      });
      box.appendChild(pre);
    });
  }

  header();
  var zoomInput = legend();
  var setZoom = timeline(showDetail);
  setZoom(1);
  zoomInput.addEventListener('input', function () { setZoom(Number(zoomInput.value)); });
  window.addEventListener('resize', function () { setZoom(Number(zoomInput.value)); });
  files();
  // For tools and the size check: how long drawing took, and how many bars were drawn.
  void document.body.offsetHeight; // include the first layout
  document.body.setAttribute('data-render-ms', (performance.now() - started).toFixed(1));
  document.body.setAttribute('data-attempt-bars', String(document.querySelectorAll('[data-attempt]').length));
}());
