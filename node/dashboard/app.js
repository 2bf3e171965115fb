// The provider dashboard's script: reads the token from the URL fragment
// (a fragment never reaches a server or its logs), keeps it in
// sessionStorage, asks gpunetd's read-only routes every 5 s with
// "Authorization: Bearer", and draws the plots as SVG polylines by hand.
// Text from the daemon (which carries peers' ids and names) only ever goes
// into textContent, never into markup.
'use strict';

(function () {
  const TOKEN_KEY = 'gpunet-dashboard-token';
  const REFRESH_MS = 5000;
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const COLOURS = ['#e4572e', '#1f77b4', '#6f42c1', '#2e7d32', '#f0ad4e', '#17a2b8', '#d63384', '#20c997'];
  const PLOT_H = 220;
  const PAD = { left: 64, right: 12, top: 10, bottom: 24 };

  function readToken() {
    const m = /(?:^#|&)token=([0-9a-f]{64})(?:&|$)/.exec(location.hash);
    if (m) {
      sessionStorage.setItem(TOKEN_KEY, m[1]);
      // Out of the address bar and the history, now that it is kept.
      history.replaceState(null, '', location.pathname + location.search);
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  const token = readToken();

  async function get(path) {
    const resp = await fetch(path, { headers: { Authorization: 'Bearer ' + (token || '') }, cache: 'no-store' });
    if (resp.status === 401)
      throw new Error('The token is missing or wrong: open the address gpunetd logged ' +
                      '(http://127.0.0.1:PORT/#token=...) or read DATA_DIR/dashboard.token.');
    if (!resp.ok)
      throw new Error(path + ': HTTP ' + resp.status);
    return resp.json();
  }

  // Money is integer micro-units; shown with up to 6 decimals, at least 2.
  function money(micro, currency) {
    const m = Math.max(0, Math.round(micro || 0));
    let frac = String(m % 1000000).padStart(6, '0').replace(/0+$/, '');
    while (frac.length < 2)
      frac += '0';
    return Math.floor(m / 1000000) + '.' + frac + (currency ? ' ' + currency : '');
  }

  function when(s) {
    if (!s)
      return '';
    const d = new Date(s * 1000);
    const p = (x) => String(x).padStart(2, '0');
    return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + ' ' +
           p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
  }

  function short(id) {
    return id && id.length > 14 ? id.slice(0, 14) + '…' : (id || '');
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null)
      e.textContent = String(text);
    if (cls)
      e.className = cls;
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k in attrs)
      e.setAttribute(k, String(attrs[k]));
    if (text !== undefined)
      e.textContent = text;
    return e;
  }

  function fill(tableId, rows, emptyText) {
    const tbody = document.querySelector('#' + tableId + ' tbody');
    const cols = document.querySelectorAll('#' + tableId + ' thead th').length;
    tbody.replaceChildren();
    if (!rows.length) {
      const td = el('td', emptyText, 'empty');
      td.colSpan = cols;
      const tr = el('tr');
      tr.appendChild(td);
      tbody.appendChild(tr);
      return;
    }
    for (const cells of rows) {
      const tr = el('tr');
      for (const c of cells)
        tr.appendChild(c instanceof Node ? c : el('td', c));
      tbody.appendChild(tr);
    }
  }

  function td(node) {
    const e = el('td');
    e.appendChild(node);
    return e;
  }

  // The top of a scale: a round number at or above v, so its quarters read well.
  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 1.2, 1.6, 2, 2.4, 3, 4, 5, 6, 8, 10])
      if (m * p >= v)
        return m * p;
    return 10 * p;
  }

  // series: [{name, colour, points: [[t_s, value], ...]}]; yMax fixes the
  // top of the scale (100 for percent), else the data's maximum sets it.
  function plot(svgEl, series, opts) {
    const W = Math.max(300, Math.round(svgEl.getBoundingClientRect().width) || 1000);
    svgEl.setAttribute('viewBox', '0 0 ' + W + ' ' + PLOT_H);
    svgEl.replaceChildren();
    const drawn = series.filter((s) => s.points.length > 0);
    if (!drawn.length) {
      svgEl.appendChild(svg('text', { x: W / 2, y: PLOT_H / 2, 'text-anchor': 'middle', class: 'note' },
                            opts.empty || 'no readings'));
      return;
    }
    let t0 = Infinity, t1 = -Infinity, vmax = opts.yMax || 0;
    for (const s of drawn)
      for (const [t, v] of s.points) {
        t0 = Math.min(t0, t);
        t1 = Math.max(t1, t);
        if (!opts.yMax)
          vmax = Math.max(vmax, v);
      }
    if (t1 <= t0)
      t0 = t1 - 10;
    if (vmax <= 0)
      vmax = 1;
    else if (!opts.yMax)
      vmax = niceCeil(vmax * 1.05);
    const x = (t) => PAD.left + (t - t0) / (t1 - t0) * (W - PAD.left - PAD.right);
    const y = (v) => PLOT_H - PAD.bottom - v / vmax * (PLOT_H - PAD.top - PAD.bottom);
    for (let i = 0; i <= 4; i++) {
      const v = vmax * i / 4;
      svgEl.appendChild(svg('line', { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), class: i ? 'grid' : 'axis' }));
      svgEl.appendChild(svg('text', { x: PAD.left - 6, y: y(v) + 4, 'text-anchor': 'end' }, opts.label(v)));
    }
    svgEl.appendChild(svg('line', { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: PLOT_H - PAD.bottom, class: 'axis' }));
    // Clock times along the bottom, with seconds when the span is short.
    const clock = (t) => when(Math.round(t)).slice(11, t1 - t0 < 600 ? 19 : 16);
    for (const t of [t0, (t0 + t1) / 2, t1])
      svgEl.appendChild(svg('text', { x: x(t), y: PLOT_H - 6, 'text-anchor': t === t0 ? 'start' : t === t1 ? 'end' : 'middle' },
                            clock(t)));
    for (const s of drawn) {
      const pts = s.points.map(([t, v]) => x(t).toFixed(1) + ',' + y(v).toFixed(1)).join(' ');
      const line = svg('polyline', { points: pts, stroke: s.colour, 'data-series': s.name });
      line.appendChild(svg('title', {}, s.name));
      svgEl.appendChild(line);
    }
  }

  function legend(listId, gpus, what) {
    const ul = document.getElementById(listId);
    ul.replaceChildren();
    gpus.forEach((g, i) => {
      const li = el('li');
      const sw = el('span', null, 'swatch');
      sw.style.background = COLOURS[(i + 1) % COLOURS.length];
      li.appendChild(sw);
      li.appendChild(document.createTextNode('GPU ' + g.index + ' ' + g.name + ' '));
      if (g.simulated)
        li.appendChild(el('span', 'simulated: no ' + what + ' readings', 'tag'));
      ul.appendChild(li);
    });
  }

  // Decimals for the earnings scale: enough that its steps differ.
  function vmaxDigits(points) {
    const top = points.reduce((m, p) => Math.max(m, p[1]), 0);
    return top >= 10 ? 2 : top >= 0.1 ? 3 : top >= 0.001 ? 5 : 2;
  }

  function drawHistory(h) {
    const ts = h.t_s || [];
    const earn = ts.map((t, i) => [t, (h.earned_micro[i] || 0) / 1e6]);
    const cur = h.currency || '';
    plot(document.getElementById('plot-earnings'), [{ name: 'earnings', colour: COLOURS[0], points: earn }],
         { label: (v) => v.toFixed(vmaxDigits(earn)) });
    const last = h.earned_micro.length ? h.earned_micro[h.earned_micro.length - 1] : 0;
    document.getElementById('earnings-total').textContent = money(last, cur) + ' billed';
    document.getElementById('earnings-currency').textContent = cur ? '(' + cur + ')' : '';
    const info = h.gpu_info || [];
    const series = (key, scale) => info.map((g, gi) => {
      const col = (h.gpus[gi] || {})[key] || [];
      const pts = [];
      ts.forEach((t, i) => {
        if (col[i] !== null && col[i] !== undefined)
          pts.push([t, col[i] * scale]);
      });
      return { name: 'GPU ' + g.index, colour: COLOURS[(gi + 1) % COLOURS.length], points: pts };
    });
    const sim = info.length && info.every((g) => g.simulated);
    plot(document.getElementById('plot-util'), series('util_pct', 1),
         { yMax: 100, label: (v) => v.toFixed(0) + ' %', empty: sim ? 'simulated GPUs: no utilisation readings' : 'no utilisation readings' });
    plot(document.getElementById('plot-power'), series('power_w', 1),
         { label: (v) => v.toFixed(0) + ' W', empty: sim ? 'simulated GPUs: no power readings' : 'no power readings' });
    legend('legend-util', info, 'utilisation');
    legend('legend-power', info, 'power');
  }

  function drawLeases(leases) {
    const rows = leases.filter((l) => l.state === 'active' && l.role === 'provider').map((l) => {
      const renter = el('td', short(l.peer));
      renter.title = l.peer;
      const gpus = (l.count || 0) + ' × ' + l.gpu_model + (l.simulated ? ' ' : '');
      const g = el('td', gpus);
      if (l.simulated)
        g.appendChild(el('span', 'simulated', 'tag'));
      return [el('td', l.id, 'lease-id'), renter, g, when(l.start_s), money(l.price_uper_hour, l.currency),
              money(l.cost_micro, l.currency)];
    });
    fill('leases', rows, 'No active leases.');
  }

  function drawInvoices(invoices) {
    const rows = invoices.slice(0, 20).map((v) => {
      const st = el('td', v.status, v.status === 'accepted' ? 'ok' : v.status === 'rejected' ? 'bad' : '');
      return [v.id, v.lease, v.role, money(v.total_micro, v.currency), st, v.settled || ''];
    });
    fill('invoices', rows, 'No invoices yet.');
  }

  function drawAttestation(list) {
    const rows = list.map((a) => {
      const v = el('td', a.verdict || 'not checked yet', a.verdict && a.verdict.startsWith('verified') ? 'ok' : '');
      if (a.simulated && !(a.verdict || '').includes('simulated'))
        v.appendChild(el('span', 'simulated', 'tag'));
      return [a.model, a.gpus.join(', '), v];
    });
    fill('attestation', rows, 'No GPUs.');
  }

  function showError(msg) {
    const p = document.getElementById('error');
    p.textContent = msg || '';
    p.hidden = !msg;
  }

  async function refresh() {
    try {
      if (!token)
        throw new Error('No token: open the address gpunetd logged (http://127.0.0.1:PORT/#token=...).');
      const [status, hist, leases, invoices, att] = await Promise.all([
        get('/v1/status'), get('/v1/history'), get('/v1/leases'), get('/v1/invoices'), get('/v1/attestation'),
      ]);
      document.getElementById('node').textContent = 'node ' + short(status.node_id) + ' · ' + status.version +
        ' · ' + status.peers + ' peers';
      document.getElementById('node').title = status.node_id;
      drawHistory(hist);
      drawLeases(leases.leases || []);
      drawInvoices(invoices.invoices || []);
      drawAttestation(att.attestation || []);
      document.getElementById('updated').textContent = 'updated ' + when(Math.floor(Date.now() / 1000)).slice(11);
      document.body.dataset.loaded = 'true';
      showError('');
    } catch (e) {
      showError(e.message);
    }
  }

  refresh();
  setInterval(refresh, REFRESH_MS);
})();
