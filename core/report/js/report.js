// The kvx report page's charts, drawn with Chart.js from kvxReport (one
// entry per variant, written by core/report's WriteHTML) and kvxTimeWord,
// the name of the clock of its times. window.kvxCharts counts the charts
// drawn, for the page's test.
(function () {
  'use strict';
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.font.size = 12;
  Chart.defaults.plugins.legend.position = 'top';
  Chart.defaults.plugins.legend.labels.boxWidth = 14;
  const palette = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];
  const vs = kvxReport;
  const tw = kvxTimeWord;
  window.kvxCharts = 0;

  function draw(where, config) {
    const box = document.createElement('div');
    box.className = 'chart';
    const canvas = document.createElement('canvas');
    box.appendChild(canvas);
    document.getElementById(where).appendChild(box);
    new Chart(canvas, config);
    window.kvxCharts++;
  }

  function fmt(v, unit) {
    const a = Math.abs(v);
    let s;
    if (a >= 1000) s = Math.round(v).toLocaleString('en-US');
    else if (a >= 100 || Number.isInteger(v)) s = v.toFixed(0);
    else if (a >= 10) s = v.toFixed(1);
    else s = v.toFixed(2);
    return unit === '%' ? s + '%' : s;
  }

  // barValues writes each bar's value above it, or inside its top when
  // there is no room above.
  function barValues(unit) {
    return {
      id: 'kvxBarValues',
      afterDatasetsDraw(chart) {
        const ctx = chart.ctx;
        ctx.save();
        ctx.font = '11px sans-serif';
        ctx.textAlign = 'center';
        chart.data.datasets.forEach((ds, i) => {
          const meta = chart.getDatasetMeta(i);
          if (meta.hidden) return;
          meta.data.forEach((bar, j) => {
            const v = ds.data[j];
            if (v === null || v === undefined || !isFinite(v)) return;
            const inside = bar.y - 14 < chart.chartArea.top;
            ctx.fillStyle = inside ? '#fff' : '#222';
            ctx.textBaseline = inside ? 'top' : 'bottom';
            ctx.fillText(fmt(v, unit), bar.x, inside ? bar.y + 2 : bar.y - 2);
          });
        });
        ctx.restore();
      },
    };
  }

  const names = vs.map(v => v.name.split(' '));

  // percentAxis sets a percentage y axis that never runs past 100%: to
  // 100% when the values come near it, else a little above the largest.
  function percentAxis(y, top) {
    y.min = 0;
    y.max = top > 60 ? 100 : Math.max(5, Math.min(100, Math.ceil(top * 1.25 / 5) * 5));
    y.ticks = { callback: v => v + '%' };
  }

  // bars draws one bar per variant for each series.
  function bars(title, unit, series) {
    let top = 0;
    const datasets = series.map((s, k) => {
      const data = vs.map(s.val);
      top = Math.max(top, ...data);
      return { label: s.name, data: data, backgroundColor: palette[k % palette.length] };
    });
    const y = { beginAtZero: true, title: { display: true, text: unit } };
    if (unit === '%') {
      percentAxis(y, top);
    } else {
      y.suggestedMax = top > 0 ? top * 1.15 : 1; // room for the values
    }
    draw('bars', {
      type: 'bar',
      data: { labels: names, datasets: datasets },
      options: {
        plugins: { title: { display: true, text: title }, legend: { display: series.length > 1 } },
        scales: { y: y },
      },
      plugins: [barValues(unit)],
    });
  }

  bars('Output throughput (tokens per second of ' + tw + ')', 'tokens/s', [
    { name: 'output tok/s', val: v => v.output_tokens_per_s }]);
  bars('Time to first token (' + tw + ')', 'ms', [
    { name: 'p50', val: v => v.latency.ttft_p50_ms }, { name: 'p99', val: v => v.latency.ttft_p99_ms }]);
  bars('Time per output token (' + tw + ')', 'ms', [
    { name: 'p50', val: v => v.latency.tpot_p50_ms }, { name: 'p99', val: v => v.latency.tpot_p99_ms }]);
  bars('Prefix reuse and KV cache use', '%', [
    { name: 'prompt tokens reused', val: v => 100 * v.hit_rate }, { name: 'of which from the host tier', val: v => 100 * v.host_rate },
    { name: 'KV peak usage', val: v => 100 * v.peak_usage }]);
  // The engine's own figures (miss reasons, preemptions, recompute, the
  // ceiling, the series over engine time) are drawn when some variant is an
  // engine run, not for kvx bench variants alone, which measure none of them.
  const engineRuns = vs.some(v => !v.bench);
  if (engineRuns) {
    // Each manager's reuse beside its ceiling: the best eviction at the run's
    // capacity (device, and host tier when it has one) and an infinite cache.
    bars('Prefix reuse against its ceiling (share of prompt tokens)', '%', [
      { name: 'reused by the manager', val: v => 100 * v.hit_rate },
      { name: 'ceiling: best eviction at its capacity', val: v => v.ceiling_rate === null ? null : 100 * v.ceiling_rate },
      { name: 'ceiling: infinite cache', val: v => v.infinite_rate === null ? null : 100 * v.infinite_rate }]);
  }
  // Why prompt tokens were computed: one bar per miss reason that any
  // variant has (partial_block alone, at 0, when none has any).
  const reasons = [...new Set(vs.flatMap(v => Object.keys(v.misses || {})))].sort();
  if (engineRuns) {
    bars('Why prompt tokens were computed (share of computed)', '%', (reasons.length ? reasons : ['partial_block']).map(r => (
      { name: r, val: v => 100 * ((v.misses || {})[r] || 0) })));
    bars('Preemptions', 'preemptions', [
      { name: 'preemptions', val: v => v.preemptions }, { name: 'of which suspended to host', val: v => v.suspensions }]);
    bars('Prefill tokens recomputed after preemption', 'tokens', [
      { name: 'recomputed', val: v => v.recomputed }]);
  }
  bars('Wall time of the run (real clock)', 's', [{ name: 'wall s', val: v => v.wall_s }]);

  // lines draws one line (or more) per variant over a linear x axis.
  function lines(where, title, xTitle, yTitle, percent, sets) {
    const y = { beginAtZero: true, title: { display: true, text: yTitle } };
    if (percent) {
      let top = 0;
      for (const s of sets) for (const p of s.data) top = Math.max(top, p.y);
      percentAxis(y, top);
    }
    draw(where, {
      type: 'line',
      data: { datasets: sets },
      options: {
        parsing: false,
        normalized: true,
        elements: { point: { radius: 0 }, line: { borderWidth: 2, tension: 0 } },
        plugins: {
          title: { display: true, text: title },
          legend: { labels: { usePointStyle: true, pointStyle: 'line' } },
        },
        scales: { x: { type: 'linear', beginAtZero: true, title: { display: true, text: xTitle } }, y: y },
      },
    });
  }

  function perVariant(make) {
    const out = [];
    vs.forEach((v, i) => {
      for (const s of make(v)) {
        if (!s || s.data.length === 0) continue;
        s.borderColor = s.backgroundColor = palette[i % palette.length];
        out.push(s);
      }
    });
    return out;
  }

  // Latency CDFs: the share of finished requests at or under x.
  for (const [key, what] of [['ttft_ms', 'Time to first token'], ['tpot_ms', 'Time per output token'], ['e2e_ms', 'End-to-end latency']]) {
    lines('cdfs', what + ': CDF per variant', 'ms of ' + tw, 'requests finished within x', true, perVariant(v => {
      const q = v.latency.quantiles;
      if (!q || !q[key]) return [];
      return [{ label: v.name, data: q[key].map((x, i) => ({ x: x, y: q.p[i] })) }];
    }));
  }

  // Series over engine time.
  function series(title, yTitle, percent, pick) {
    lines('series', title + ', over ' + tw, 's of ' + tw, yTitle, percent, perVariant(v => {
      const s = v.series;
      if (!s) return [];
      return pick(s).map(([label, ys, dash]) => ({
        label: label.replace('$', v.name),
        data: ys.map((y, i) => ({ x: s.t_s[i], y: y })),
        borderDash: dash ? [6, 3] : [],
      }));
    }));
  }

  // Capacity (kvx compare --capacity): p95 TTFT against the load per
  // configuration, with the SLO as a dashed line.
  if (kvxCapacity && kvxCapacity.groups.length > 0) {
    const c = kvxCapacity;
    const sets = c.groups.map((g, i) => ({
      label: g.name,
      data: g.points.filter(p => p.ttft_p95_ms !== null).map(p => ({ x: p.load, y: p.ttft_p95_ms })),
      borderColor: palette[i % palette.length], backgroundColor: palette[i % palette.length],
    }));
    const loads = c.groups.flatMap(g => g.points.map(p => p.load));
    sets.push({
      label: 'SLO ' + fmt(c.slo_ttft_p95_ms) + ' ms',
      data: [{ x: Math.min(...loads), y: c.slo_ttft_p95_ms }, { x: Math.max(...loads), y: c.slo_ttft_p95_ms }],
      borderColor: '#888', backgroundColor: '#888', borderDash: [6, 3], pointRadius: 0,
    });
    draw('capacity', {
      type: 'line',
      data: { datasets: sets },
      options: {
        parsing: false,
        elements: { point: { radius: 3 }, line: { borderWidth: 2, tension: 0 } },
        plugins: {
          title: { display: true, text: 'p95 TTFT against ' + c.load_key },
          legend: { labels: { usePointStyle: true, pointStyle: 'line' } },
        },
        scales: {
          x: { type: 'linear', title: { display: true, text: c.load_key } },
          y: { beginAtZero: true, title: { display: true, text: 'p95 TTFT, ms of ' + tw } },
        },
      },
    });
  }

  if (engineRuns) {
    series('KV cache usage (fullest stage, max per interval)', 'device blocks in use', true, s => [['$', s.kv_usage.map(u => 100 * u)]]);
    series('Prefix hit rate so far', 'prompt tokens reused', true, s => [['$', s.hit_rate.map(h => 100 * h)]]);
    series('Running and waiting requests (max per interval)', 'requests', false, s => [
      ['$ running', s.running], ['$ waiting', s.waiting, true]]);
    series('Preemptions so far', 'preemptions', false, s => [['$', s.preemptions]]);
  }
})();
