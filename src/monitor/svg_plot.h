// Line plots as inline SVG for the HTML report (svg_plot.cpp): axes with
// rounded ticks, one <path> per series, optional point markers, native
// <title> tooltips. Long series are thinned to at most kMaxPoints while
// keeping each bucket's lowest and highest value, so a spike of one step in
// a run of a million still shows. Private to the monitor layer.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace brisk::monitor {

struct PlotSeries {
  std::string label;      // tooltip text ("run-a: loss")
  std::string css_class;  // "run-0": the legend toggles every element of a run by it
  std::string color;
  std::vector<std::pair<double, double>> points;  // (step, value), finite values only
  bool line = true;       // false: markers only (e.g. spikes)
  bool dashed = false;
  bool markers = false;   // a circle per point (forced for series of a few points)
};

struct PlotSpec {
  std::string id;          // the <svg> element's id: "plot-loss"
  std::string title;
  std::string y_label;     // unit, e.g. "tokens/s"
  bool log_y = false;      // for loss scales (powers of two)
  std::vector<PlotSeries> series;
};

constexpr size_t kMaxPoints = 1200;

// Keeps at most about max_points of (x, y): the min and max of each bucket.
std::vector<std::pair<double, double>> thin_points(const std::vector<std::pair<double, double>>& pts,
                                                   size_t max_points = kMaxPoints);

// "1.2k", "3.4M", "0.0003", "12": short tick and value labels.
std::string short_number(double v);

// HTML/XML text escaping (& < > " ').
std::string html_escape(const std::string& s);

// The <svg class="plot"> element; an empty plot (no points in any series)
// says "no data" in its frame.
std::string svg_line_plot(const PlotSpec& spec);

}  // namespace brisk::monitor
