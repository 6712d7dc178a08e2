/* gpuadmin charts: history from the JSON API, drawn with uPlot.
 *
 * No inline script anywhere: the pages describe each chart with data-
 * attributes and this file (loaded with <script src defer>) finds them.
 *
 *   <section data-history-src="/api/v1/hosts/gpu01/history/?range=24h">
 *     <figure data-chart="gpu" data-gpu-uuid="GPU-...">   used, attributed, unattributed (stacked) + utilization
 *     <figure data-chart="gpu-health" data-gpu-uuid="GPU-..."> temperature, power draw and limit
 *     <figure data-chart="host">                          zombies, D state, PIDs in use vs pid_max
 *   <figure data-chart="process" data-src="/api/v1/hosts/gpu01/processes/4120-412000/">
 *   <figure data-chart="usage" data-src="/api/v1/usage/?from=...&by=user">  GPU-hours per day, stacked by row
 *
 * Each figure holds .chart-canvas (the plot), .chart-table (its numbers as a
 * table, filled on first open) and a.chart-csv (the same numbers as CSV).
 * Kill requests become marks on the time axis that link to the request: at the moment the order
 * was sent (ran_at), and on a GPU's charts only when the kill touched that GPU.
 * Times are 24-hour in the lab's zone (the figure's data-time-zone: settings.TIME_ZONE); memory axes
 * tick at round binary steps (0, 16, 32 GiB); the numbers table has words for headers and units for
 * values, the CSV keeps the API's names and raw values.
 * htmx swaps in a new section when the range changes; htmx.onLoad runs init
 * on the new content, so nothing reloads the page.
 */
(function () {
  "use strict";

  var GiB = 1024 * 1024 * 1024;
  var COLORS = {
    attributed: "#3b7dd8",
    unattributed: "#e0922f",
    used: "#1d232b",
    utilization: "#2e7d32",
    zombies: "#b3261e",
    dState: "#8a5a00",
    pids: "#1f5fa8",
    pidMax: "#5b6572",
    kill: "#b3261e",
    state: "#6b6f76",
    temperature: "#c2410c",
    power: "#6d28d9",
    powerLimit: "#5b6572",
  };

  function seconds(iso) {
    return Date.parse(iso) / 1000;
  }

  function isoText(unixSeconds) {
    return new Date(unixSeconds * 1000).toISOString().replace(".000Z", "Z");
  }

  // The lab's zone, from the figure being drawn (set in draw()); UTC when a page does not say.
  var zone = "Etc/UTC";

  function pad(n) { return String(n).padStart(2, "0"); }

  function zoned(unixSeconds) { return uPlot.tzDate(new Date(unixSeconds * 1000), zone); }

  // "2026-12-04 14:05:09": 24-hour, in the lab's zone.
  function timeText(unixSeconds) {
    if (unixSeconds === null || unixSeconds === undefined) return "—";
    var d = zoned(unixSeconds);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  // The time axis: "14:05", a tick at midnight or a step of a day or more as "12-04".
  function timeTicks(u, ticks, axisIdx, space, increment) {
    return ticks.map(function (t) {
      var d = zoned(t);
      var midnight = d.getHours() === 0 && d.getMinutes() === 0;
      if (increment >= 86400 || midnight) return pad(d.getMonth() + 1) + "-" + pad(d.getDate());
      return pad(d.getHours()) + ":" + pad(d.getMinutes());
    });
  }

  var TIME_AXIS = {values: timeTicks};

  // Round binary steps for a memory axis: a power of two bytes, about four to eight ticks.
  function binarySplits(u, axisIdx, min, max) {
    var span = max - min;
    if (!(span > 0)) return [min];
    var step = Math.pow(2, Math.ceil(Math.log2(span / 8)));
    var ticks = [];
    for (var v = Math.ceil(min / step) * step; v <= max + step / 1e6; v += step) ticks.push(v);
    return ticks;
  }

  function tickBytes(u, ticks) {
    return ticks.map(function (t) { return bytesText(t).replace(".0 ", " "); });
  }

  // A count with thousands separators: 4,194,304.
  function countText(value) {
    return value === null || value === undefined ? "—" : Math.round(value).toLocaleString("en-US");
  }

  function bytesText(value) {
    if (value === null || value === undefined) return "—";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var i = 0;
    var v = value;
    while (Math.abs(v) >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return (i === 0 ? String(v) : v.toFixed(v >= 100 ? 0 : 1)) + " " + units[i];
  }

  function plainText(value) {
    return value === null || value === undefined ? "—" : String(value);
  }

  function percentText(value) {
    return value === null || value === undefined ? "—" : value.toFixed(1) + "%";
  }

  /* --- what each chart shows: columns (for table and CSV) and uPlot series --- */

  function gpuChart(gpu, payload) {
    var pts = gpu.points;
    var xs = pts.map(function (p) { return seconds(p.t); });
    var attributed = pts.map(function (p) { return p.memory_attributed_bytes; });
    var used = pts.map(function (p) { return p.memory_used_bytes; });
    var unattributed = pts.map(function (p) {
      if (p.memory_used_bytes === null) return null;
      return Math.max(0, p.memory_used_bytes - p.memory_attributed_bytes);
    });
    // Stacked: the attributed band, then unattributed on top of it, whose top is "used".
    var stackTop = pts.map(function (p, i) {
      return p.memory_used_bytes === null ? null : attributed[i] + unattributed[i];
    });
    var utilization = pts.map(function (p) { return p.utilization_percent; });
    var suffix = payload.aggregation ? " (" + payload.aggregation.memory + ")" : "";
    return {
      title: "GPU " + gpu.index,
      columns: [
        {name: "t", header: "Time", values: xs, text: timeText},
        {name: "memory_used_bytes", header: "Used", values: used, text: bytesText},
        {name: "memory_attributed_bytes", header: "Attributed", values: attributed, text: bytesText},
        {name: "memory_unattributed_bytes", header: "Unattributed", values: unattributed, text: bytesText},
        {name: "utilization_percent", header: "Utilization", values: utilization, text: percentText},
      ],
      data: [xs, attributed, stackTop, utilization],
      series: [
        {label: "Time", value: function (u, v) { return timeText(v); }},
        {label: "Attributed" + suffix, scale: "bytes", stroke: COLORS.attributed, fill: COLORS.attributed + "66",
         value: function (u, v) { return bytesText(v); }},
        {label: "Used = attributed + unattributed" + suffix, scale: "bytes", stroke: COLORS.unattributed,
         value: function (u, v) { return bytesText(v); }},
        {label: "Utilization" + (payload.aggregation ? " (" + payload.aggregation.utilization + ")" : ""),
         scale: "%", stroke: COLORS.utilization, width: 1.5, value: function (u, v) { return percentText(v); }},
      ],
      bands: [{series: [2, 1], fill: COLORS.unattributed + "55"}],
      axes: [
        TIME_AXIS,
        {scale: "bytes", splits: binarySplits, values: tickBytes, size: 70},
        {scale: "%", side: 1, grid: {show: false}, values: function (u, ticks) {
          return ticks.map(function (t) { return t + "%"; }); }},
      ],
      scales: {bytes: {range: [0, Math.max(gpu.memory_total_bytes || 0, Math.max.apply(null, used.concat([GiB])))]},
               "%": {range: [0, 100]}},
      markers: killMarks(payload.kill_requests, gpu.uuid),
      window: historyWindow(payload),
    };
  }

  function wattsText(milliwatts) {
    return milliwatts === null || milliwatts === undefined ? "—" : (milliwatts / 1000).toFixed(0) + " W";
  }

  function celsiusText(value) {
    return value === null || value === undefined ? "—" : value + " °C";
  }

  // Temperature and power draw against the limit; gaps where the GPU did not say (null).
  function gpuHealthChart(gpu, payload) {
    var pts = gpu.points;
    var xs = pts.map(function (p) { return seconds(p.t); });
    var col = function (key) { return pts.map(function (p) { return p[key]; }); };
    var suffix = payload.aggregation ? " (" + payload.aggregation.health + ")" : "";
    var powerDraw = col("power_draw_milliwatts");
    var limit = col("power_limit_milliwatts");
    return {
      title: "GPU " + gpu.index + " health",
      columns: [
        {name: "t", header: "Time", values: xs, text: timeText},
        {name: "temperature_celsius", header: "Temperature", values: col("temperature_celsius"), text: celsiusText},
        {name: "power_draw_milliwatts", header: "Power draw", values: powerDraw, text: wattsText},
        {name: "power_limit_milliwatts", header: "Power limit", values: limit, text: wattsText},
      ],
      data: [xs, col("temperature_celsius"), powerDraw, limit],
      series: [
        {label: "Time", value: function (u, v) { return timeText(v); }},
        {label: "Temperature" + suffix, scale: "celsius", stroke: COLORS.temperature, width: 1.5,
         value: function (u, v) { return celsiusText(v); }},
        {label: "Power draw" + suffix, scale: "milliwatts", stroke: COLORS.power, width: 1.5,
         value: function (u, v) { return wattsText(v); }},
        {label: "Power limit", scale: "milliwatts", stroke: COLORS.powerLimit, dash: [6, 4], width: 1,
         value: function (u, v) { return wattsText(v); }},
      ],
      axes: [
        TIME_AXIS,
        {scale: "celsius", values: function (u, ticks) { return ticks.map(celsiusText); }, size: 60},
        {scale: "milliwatts", side: 1, grid: {show: false}, size: 60,
         values: function (u, ticks) { return ticks.map(wattsText); }},
      ],
      scales: {celsius: {range: function (u, min, max) { return [0, Math.max(100, max || 0)]; }},
               milliwatts: {range: function (u, min, max) { return [0, Math.max(100000, max || 0)]; }}},
      markers: killMarks(payload.kill_requests, gpu.uuid),
      window: historyWindow(payload),
    };
  }

  function hostChart(host, payload) {
    var pts = host.points;
    var xs = pts.map(function (p) { return seconds(p.t); });
    var col = function (key) { return pts.map(function (p) { return p[key]; }); };
    var suffix = payload.aggregation ? " (" + payload.aggregation.host_counts + ")" : "";
    return {
      title: "Processes",
      columns: [
        {name: "t", header: "Time", values: xs, text: timeText},
        {name: "zombies", header: "Zombies", values: col("zombies"), text: countText},
        {name: "d_state", header: "D state", values: col("d_state"), text: countText},
        {name: "pids_in_use", header: "PIDs in use", values: col("pids_in_use"), text: countText},
        {name: "pid_max", header: "PID limit (pid_max)", values: col("pid_max"), text: countText},
      ],
      data: [xs, col("zombies"), col("d_state"), col("pids_in_use"), col("pid_max")],
      series: [
        {label: "Time", value: function (u, v) { return timeText(v); }},
        {label: "Zombies" + suffix, scale: "count", stroke: COLORS.zombies, width: 1.5},
        {label: "D state" + suffix, scale: "count", stroke: COLORS.dState, width: 1.5},
        {label: "PIDs in use" + suffix + " (log scale)", scale: "pids", stroke: COLORS.pids, width: 1.5},
        {label: "pid_max", scale: "pids", stroke: COLORS.pidMax, dash: [6, 4], width: 1},
      ],
      axes: [TIME_AXIS, {scale: "count"}, {scale: "pids", side: 1, grid: {show: false}, size: 90,
                                           values: function (u, ticks) { return ticks.map(countText); }}],
      // PIDs on a log scale: a few hundred in use and a pid_max of 4 million both stay readable.
      scales: {count: {range: function (u, min, max) { return [0, Math.max(1, max)]; }},
               pids: {distr: 3, log: 10}},
      markers: killMarks(payload.kill_requests, null),
      window: historyWindow(payload),
    };
  }

  function processChart(payload) {
    var pts = payload.points;
    var xs = pts.map(function (p) { return seconds(p.t); });
    var memory = pts.map(function (p) { return p.gpu_memory_bytes; });
    var states = pts.map(function (p) { return p.state; });
    var marks = killMarks(payload.kill_requests, undefined).concat(
      payload.state_changes.map(function (c) {
        return {t: seconds(c.t), label: "state " + c.state, title: "state " + c.state + " since " + timeText(seconds(c.t)),
                color: COLORS.state};
      }));
    return {
      title: "GPU memory",
      columns: [
        {name: "t", header: "Time", values: xs, text: timeText},
        {name: "gpu_memory_bytes", header: "GPU memory", values: memory, text: bytesText},
        {name: "state", header: "State", values: states, text: plainText},
      ],
      data: [xs, memory],
      series: [
        {label: "Time", value: function (u, v) { return timeText(v); }},
        {label: "GPU memory", scale: "bytes", stroke: COLORS.attributed, fill: COLORS.attributed + "44",
         paths: uPlot.paths.stepped({align: 1}), value: function (u, v) { return bytesText(v); }},
      ],
      axes: [TIME_AXIS, {scale: "bytes", splits: binarySplits, values: tickBytes, size: 70}],
      scales: {bytes: {range: function (u, min, max) { return [0, Math.max(GiB, max)]; }}},
      markers: marks,
    };
  }

  var USAGE_COLORS = ["#3b7dd8", "#e0922f", "#2e7d32", "#b3261e", "#6d28d9", "#8a5a00", "#1f5fa8", "#c2410c"];

  function hoursText(value) {
    return value === null || value === undefined ? "—" : value.toFixed(2) + " h";
  }

  // GPU-hours per UTC day, one band per row of the usage table (its first eight; the rest as "others"),
  // stacked: each series is drawn as the running total, the biggest first so the smaller ones paint on top.
  function usageChart(payload) {
    var xs = payload.days.map(function (d) { return seconds(d + "T00:00:00Z"); });
    var rows = payload.rows.slice(0, USAGE_COLORS.length).map(function (r) {
      return {label: r.label, values: r.held_gpu_hours_per_day};
    });
    var rest = payload.rows.slice(USAGE_COLORS.length);
    if (rest.length) {
      rows.push({label: "others", values: xs.map(function (x, i) {
        return rest.reduce(function (sum, r) { return sum + r.held_gpu_hours_per_day[i]; }, 0);
      })});
    }
    var running = xs.map(function () { return 0; });
    var stacked = rows.map(function (r) {
      running = running.map(function (v, i) { return v + r.values[i]; });
      return running.slice();
    });
    var order = rows.map(function (r, i) { return i; }).reverse();
    var columns = [{name: "t", values: xs, text: isoText}].concat(rows.map(function (r) {
      return {name: r.label, values: r.values, text: hoursText};
    }));
    // Each day is a step from its midnight to the next: one more point closes the last day's.
    var edges = xs.length ? xs.concat([xs[xs.length - 1] + 86400]) : xs;
    var closed = function (values) { return values.length ? values.concat([values[values.length - 1]]) : values; };
    return {
      title: "GPU-hours per day",
      columns: columns,
      data: [edges].concat(order.map(function (i) { return closed(stacked[i]); })),
      series: [{label: "Day", value: function (u, v) { return v === null ? "—" : isoText(v).slice(0, 10); }}]
        .concat(order.map(function (i) {
          var color = i < USAGE_COLORS.length ? USAGE_COLORS[i] : "#5b6572";
          return {label: rows[i].label, scale: "h", stroke: color, fill: color + "99",
                  paths: uPlot.paths.stepped({align: 1}),
                  value: function (u, v, s, idx) { return idx === null ? "—" : hoursText(rows[i].values[idx]); }};
        })),
      axes: [{}, {scale: "h", values: function (u, ticks) { return ticks.map(function (t) { return t + " h"; }); }}],
      scales: {h: {range: function (u, min, max) { return [0, Math.max(1, max)]; }}},
    };
  }

  // The range asked for, [from, to] in seconds (the history API says both).
  function historyWindow(payload) {
    return payload.from && payload.to ? [seconds(payload.from), seconds(payload.to)] : [];
  }

  // gpuUuid: a GPU's chart (only kills that ran and touched it), null: the host's chart (kills that
  // ran), undefined: a process's chart (its requests, run or not: filed ones at their filing time).
  function killMarks(requests, gpuUuid) {
    return (requests || []).filter(function (k) {
      if (gpuUuid === undefined) return true;
      if (!k.ran_at) return false;
      return gpuUuid === null || (k.gpu_uuids || []).indexOf(gpuUuid) >= 0;
    }).map(function (k) {
      var at = seconds(k.ran_at || k.t);
      var what = k.ran_at ? " sent at " : " filed at ";
      return {t: at, label: "kill #" + k.id, title: "kill request #" + k.id + " (" + k.status + ")" + what + timeText(at),
              href: k.url, color: COLORS.kill};
    });
  }

  /* --- markers: lines on the canvas, links over them --- */

  function markersPlugin(marks) {
    function place(u) {
      var layer = u.over.querySelector(".chart-marks");
      if (!layer) {
        layer = document.createElement("div");
        layer.className = "chart-marks";
        u.over.appendChild(layer);
      }
      layer.textContent = "";
      marks.forEach(function (m) {
        var x = u.valToPos(m.t, "x");
        if (x < 0 || x > u.over.clientWidth) return;
        var el = document.createElement(m.href ? "a" : "span");
        el.className = "chart-mark";
        if (m.href) el.href = m.href;
        el.title = m.title;
        el.textContent = m.label;
        el.style.left = x + "px";
        el.style.borderColor = m.color;
        el.style.color = m.color;
        layer.appendChild(el);
      });
    }
    return {hooks: {ready: [place], setScale: [place], setSize: [place]}};
  }

  /* --- table and CSV --- */

  function csvCell(text) {
    return /[",\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
  }

  function csvText(chart) {
    var lines = [chart.columns.map(function (c) { return c.name; }).join(",")];
    var rows = chart.columns[0].values.length;
    for (var i = 0; i < rows; i += 1) {
      lines.push(chart.columns.map(function (c) {
        var v = c.values[i];
        return csvCell(v === null || v === undefined ? "" : (c.name === "t" ? isoText(v) : String(v)));
      }).join(","));
    }
    return lines.join("\n") + "\n";
  }

  function fillTable(container, chart) {
    var table = document.createElement("table");
    table.className = "data chart-numbers-table small";
    var head = table.createTHead().insertRow();
    chart.columns.forEach(function (c) {
      var th = document.createElement("th");
      th.textContent = c.header || c.name;
      if (c.name !== "t") th.className = "num";
      head.appendChild(th);
    });
    var body = table.createTBody();
    var rows = chart.columns[0].values.length;
    for (var i = 0; i < rows; i += 1) {
      var tr = body.insertRow();
      chart.columns.forEach(function (c) {
        var cell = tr.insertCell();
        cell.textContent = c.text(c.values[i]);
        if (c.name !== "t") cell.className = "num";
      });
    }
    container.textContent = "";
    container.appendChild(table);
  }

  /* --- drawing --- */

  function draw(figure, chart) {
    zone = figure.getAttribute("data-time-zone") || "Etc/UTC";
    var canvasBox = figure.querySelector(".chart-canvas");
    if (!canvasBox) return;
    canvasBox.textContent = "";
    if (chart.columns[0].values.length === 0) {
      canvasBox.textContent = "No samples in this range yet.";
      canvasBox.classList.add("chart-empty");
      figure.setAttribute("data-chart-state", "empty");
      return;
    }
    var width = Math.max(280, canvasBox.clientWidth || figure.clientWidth || 600);
    // The time axis spans the chosen window (the last hour: an hour wide even with three samples),
    // and every mark and sample beyond it; a chart without a window spans its data and marks.
    var times = chart.data[0].concat((chart.markers || []).map(function (m) { return m.t; }),
                                     chart.window || []);
    var first = Math.min.apply(null, times);
    var last = Math.max.apply(null, times);
    if (last - first < 60) { first -= 30; last += 30; }
    var options = {
      // Axis times in the lab's zone, 24-hour (zone: set by draw's caller from data-time-zone).
      tzDate: function (ts) { return zoned(ts); },
      width: width,
      height: 220,
      series: chart.series,
      axes: chart.axes,
      scales: Object.assign({x: {time: true, range: [first, last]}}, chart.scales),
      bands: chart.bands,
      cursor: {drag: {x: true, y: false}},
      legend: {live: true},
      plugins: [markersPlugin(chart.markers || [])],
    };
    var plot = new uPlot(options, chart.data, canvasBox);
    figure.setAttribute("data-chart-state", "drawn");
    figure.setAttribute("data-points", String(chart.columns[0].values.length));
    figure._plot = plot;

    var csv = figure.querySelector("a.chart-csv");
    if (csv) {
      if (csv.href && csv.href.indexOf("blob:") === 0) URL.revokeObjectURL(csv.href);
      csv.href = URL.createObjectURL(new Blob([csvText(chart)], {type: "text/csv"}));
    }
    var details = figure.querySelector("details.chart-numbers");
    var tableBox = figure.querySelector(".chart-table");
    if (details && tableBox) {
      var filled = false;
      var fill = function () {
        if (details.open && !filled) {
          fillTable(tableBox, chart);
          filled = true;
        }
      };
      details.addEventListener("toggle", fill);
      fill();
    }
  }

  function failed(figures, message) {
    figures.forEach(function (figure) {
      var box = figure.querySelector(".chart-canvas");
      if (box) box.textContent = message;
      figure.setAttribute("data-chart-state", "error");
    });
  }

  function fetchJson(url) {
    return fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}}).then(function (r) {
      if (!r.ok) throw new Error("the history API answered " + r.status);
      return r.json();
    });
  }

  function initHistory(section) {
    var figures = Array.prototype.slice.call(section.querySelectorAll("figure[data-chart]"));
    fetchJson(section.getAttribute("data-history-src")).then(function (payload) {
      if (figures.length) zone = figures[0].getAttribute("data-time-zone") || zone;
      var byUuid = {};
      payload.gpus.forEach(function (g) { byUuid[g.uuid] = g; });
      // Raw samples (no aggregation) are change-coded: each holds until the next, so a step, not a slope.
      var held = function (chart) {
        if (!payload.aggregation) {
          chart.series.slice(1).forEach(function (s) { s.paths = s.paths || uPlot.paths.stepped({align: 1}); });
        }
        return chart;
      };
      figures.forEach(function (figure) {
        var kind = figure.getAttribute("data-chart");
        if (kind === "gpu") {
          var gpu = byUuid[figure.getAttribute("data-gpu-uuid")];
          if (gpu) draw(figure, held(gpuChart(gpu, payload)));
        } else if (kind === "gpu-health") {
          var healthOf = byUuid[figure.getAttribute("data-gpu-uuid")];
          if (healthOf) draw(figure, held(gpuHealthChart(healthOf, payload)));
        } else if (kind === "host") {
          draw(figure, held(hostChart(payload.host, payload)));
        }
      });
    }).catch(function (error) { failed(figures, "Could not load the history: " + error.message); });
  }

  function initProcess(figure) {
    fetchJson(figure.getAttribute("data-src")).then(function (payload) {
      zone = figure.getAttribute("data-time-zone") || zone;
      draw(figure, processChart(payload));
    }).catch(function (error) { failed([figure], "Could not load the history: " + error.message); });
  }

  function scope_(root) { return root && root.querySelectorAll ? root : document; }

  function initUsage(figure) {
    fetchJson(figure.getAttribute("data-src")).then(function (payload) {
      draw(figure, usageChart(payload));
    }).catch(function (error) { failed([figure], "Could not load the usage: " + error.message); });
  }

  function init(root) {
    if (typeof uPlot === "undefined") return;
    var usage = Array.prototype.slice.call(scope_(root).querySelectorAll("figure[data-chart='usage'][data-src]"));
    usage.forEach(initUsage);
    var scope = root && root.querySelectorAll ? root : document;
    var sections = Array.prototype.slice.call(scope.querySelectorAll("[data-history-src]"));
    if (scope.matches && scope.matches("[data-history-src]")) sections.push(scope);
    sections.forEach(initHistory);
    var processes = Array.prototype.slice.call(scope.querySelectorAll("figure[data-chart='process'][data-src]"));
    if (scope.matches && scope.matches("figure[data-chart='process'][data-src]")) processes.push(scope);
    processes.forEach(initProcess);
  }

  // Resize with the window: uPlot draws at a fixed size.
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      document.querySelectorAll("figure[data-chart]").forEach(function (figure) {
        var box = figure.querySelector(".chart-canvas");
        if (figure._plot && box) figure._plot.setSize({width: Math.max(280, box.clientWidth), height: 220});
      });
    }, 150);
  });

  if (window.htmx && window.htmx.onLoad) {
    window.htmx.onLoad(init);  // the first page load and every swapped-in fragment
  } else {
    document.addEventListener("DOMContentLoaded", function () { init(document); });
  }
})();
