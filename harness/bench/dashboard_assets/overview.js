/* The overview page: draws window.HARNESS_OVERVIEW (written by harness/dashboard.py `overview`) with flot.
   One section per benchmark and machine, one plot per panel (at most 6 series), the legend beside the plot,
   each point's interquartile range as a vertical bar, the goal as a horizontal line, confirmed steps as
   vertical lines labelled with their commit. */
(function () {
  "use strict";
  var COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"];  // Okabe & Ito

  function text(tag, cls, content) {
    return $("<" + tag + ">").addClass(cls || "").text(content || "");
  }

  function spreadSegments(points) {
    /* [x, q25], [x, q75], null, ...: flot draws one vertical bar per point that has quartiles */
    var out = [];
    $.each(points, function (_, p) {
      if (p[2] !== null && p[3] !== null) { out.push([p[0], p[2]], [p[0], p[3]], null); }
    });
    return out;
  }

  function yRange(panel) {
    var values = [];
    $.each(panel.series, function (_, s) {
      $.each(s.points, function (_, p) { values.push(p[1]); if (p[2] !== null) { values.push(p[2], p[3]); } });
    });
    if (panel.goal) { values.push(panel.goal.value); }
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values), pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.1 || 1;
    return {min: lo - pad, max: hi + pad};
  }

  function ticks(commits) {
    var step = Math.max(1, Math.ceil(commits.length / 8)), out = [];
    for (var i = 0; i < commits.length; i += step) { out.push([i, commits[i][0] + "<br>" + commits[i][1]]); }
    return out;
  }

  function drawPanel(graph, panel, box) {
    var plotDiv = $("<div>").addClass("plot"), legend = $("<div>").addClass("legend"),
        plotBox = $("<div>").addClass("plot-box").append(plotDiv), hover = $("<div>").addClass("hover");
    box.append($("<div>").addClass("panel").append($("<div>").append(
      text("h3", "", panel.title || "all cases"), plotBox, hover), legend));
    var data = [];
    $.each(panel.series, function (i, s) {
      var color = COLORS[i % COLORS.length];
      data.push({data: $.map(s.points, function (p) { return [[p[0], p[1]]]; }), label: s.label, color: color,
                 lines: {show: true, lineWidth: 1.5}, points: {show: true, radius: 3}, shadowSize: 0,
                 harness: {kind: "value", points: s.points}});
      data.push({data: spreadSegments(s.points), color: color, lines: {show: true, lineWidth: 1.5},
                 points: {show: false}, shadowSize: 0, harness: {kind: "spread"}});
    });
    var markings = [];
    if (panel.goal) {
      markings.push({yaxis: {from: panel.goal.value, to: panel.goal.value}, color: "#070", lineWidth: 1.5});
    }
    $.each(panel.steps, function (_, s) {
      markings.push({xaxis: {from: s.x - 0.5, to: s.x - 0.5}, color: "#a00", lineWidth: 1});
    });
    var n = graph.commits.length;
    var plot = $.plot(plotDiv, data, {
      xaxis: {min: -0.5, max: n - 0.5, ticks: ticks(graph.commits)},
      yaxis: yRange(panel),
      grid: {markings: markings, hoverable: true, borderWidth: 1},
      legend: {container: legend, noColumns: 1}
    });
    if (panel.goal) {
      var at = plot.pointOffset({x: n - 0.5, y: panel.goal.value});
      plotBox.append(text("div", "goal-label", "goal " + (panel.goal.better === "above" ? ">= " : "<= ") + panel.goal.value)
        .css({right: 8, top: at.top - 16}));
    }
    $.each(panel.steps, function (i, s) {
      var at = plot.pointOffset({x: s.x - 0.5, y: plot.getAxes().yaxis.max});
      plotBox.append(text("div", "step-label", s.after.slice(0, 8) + ": " + s.compare.verdict + " x" +
                          s.compare.ratio.toFixed(3)).css({left: at.left + 3, top: at.top + 4 + 14 * i}));
    });
    plotDiv.on("plothover", function (_, pos, item) {
      if (!item || !item.series.harness || item.series.harness.kind !== "value") { hover.text(""); return; }
      var p = item.series.harness.points[item.dataIndex], c = graph.commits[p[0]];
      hover.text(item.series.label + " at " + c[0] + " (" + c[1] + "): " + p[1].toPrecision(4) +
                 (p[2] !== null ? "  [quartiles " + p[2].toPrecision(4) + " - " + p[3].toPrecision(4) + "]" : "") +
                 ", " + p[5] + " sample" + (p[5] === 1 ? "" : "s"));
    });
  }

  function drawGraph(graph, i, machines) {
    var parts = graph.benchmark.split("."), section = $("<section>").addClass("graph")
      .attr({id: "graph-" + i, "data-benchmark": graph.benchmark, "data-machine": graph.machine});
    section.append($("<h2>").append(text("span", "name", parts.slice(1).join(".")),
                                    text("span", "machine", "  on " + graph.machine)));
    section.append(text("p", "about", parts[0] + ".py; machine " + graph.machine + " (" + machines[graph.machine] +
                        "); " + graph.history + " commits in its longest series; unit: " + (graph.unit || "?")));
    $("#graphs").append(section);
    $.each(graph.panels, function (_, panel) { drawPanel(graph, panel, section); });
  }

  function listSingle(single, machines) {
    if (!single.length) { return; }
    var table = $("<table>").append($("<tr>").append(text("th", "", "benchmark"), text("th", "", "machine"),
                                                       text("th", "", "cases"), text("th", "", "commit")));
    $.each(single, function (_, s) {
      table.append($("<tr>").append(text("td", "", s.benchmark), text("td", "", s.machine + " (" + machines[s.machine] + ")"),
                                    text("td", "", s.cases), text("td", "", s.commit)));
    });
    $("#single").append(text("h2", "", "Measured at one commit only (no history to draw yet; see asv's pages)"), table);
  }

  $(function () {
    var data = window.HARNESS_OVERVIEW;
    $("#generated").text("Published " + data.generated.date + " from commit " + data.generated.commit + ".");
    $.each(data.graphs, function (i, graph) { drawGraph(graph, i, data.machines); });
    listSingle(data.single, data.machines);
    window.HARNESS_DRAWN = true;
  });
})();
