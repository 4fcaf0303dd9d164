// Tessera portal: draws the charts of a page from their JSON ({t, unit, series: [{label, values}]}) with uPlot.
(function () {
  "use strict";
  const COLOURS = ["#2f6fb5", "#2e7d4f", "#a05a00", "#6b2fa0", "#b3261e", "#5b6775"];
  function draw(el) {
    const source = document.getElementById(el.dataset.chart);
    if (!source || !window.uPlot) return;
    const data = JSON.parse(source.textContent);
    const width = Math.max(320, el.clientWidth || 800);
    const opts = {
      width: width, height: 240,
      series: [{}].concat(data.series.map(function (s, i) {
        const sparse = s.values.filter(function (v) { return v != null; }).length < 60;
        return { label: s.label, stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: false,
                 points: { show: sparse, size: 5 },
                 value: function (u, v) { return v == null ? "—" : v.toFixed(2) + " " + data.unit; } };
      })),
      axes: [{}, { label: data.unit, size: 60 }],
      scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max * 1.1)]; } } },
    };
    el.innerHTML = "";
    new window.uPlot(opts, [data.t].concat(data.series.map(function (s) { return s.values; })), el);
  }
  function drawAll() { document.querySelectorAll("[data-chart]").forEach(draw); }
  window.addEventListener("load", drawAll);
})();
