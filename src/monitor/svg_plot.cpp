// SVG line plots (svg_plot.h). Coordinates are written with one decimal in a
// fixed 600 x 280 viewBox; the page scales the element to its column, so
// the plot stays sharp at any width without a script.
#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace brisk::monitor {

namespace {

constexpr double kW = 600, kH = 280;
constexpr double kLeft = 66, kRight = 14, kTop = 30, kBottom = 40;
constexpr double kPw = kW - kLeft - kRight, kPh = kH - kTop - kBottom;
constexpr size_t kMarkerBelow = 30;  // series of fewer points get markers: a line alone hides them

std::string f1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// 1, 2 or 5 times a power of ten, near x.
double nice_step(double x) {
  const double e = std::pow(10.0, std::floor(std::log10(x)));
  const double f = x / e;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * e;
}

// Ticks at multiples of a nice step, each computed from its index (adding
// the step would stand still once it is below the values' precision, as for
// steps near 1e17 a few apart). A range past double's reach gets none.
std::vector<double> linear_ticks(double lo, double hi) {
  std::vector<double> t;
  const double step = nice_step((hi - lo) / 5);
  if (!std::isfinite(step) || !(step > 0)) return t;
  const double first = std::ceil(lo / step);
  for (int k = 0; k < 64; ++k) {
    const double v = (first + k) * step;
    if (!(v <= hi + step * 1e-9) || (!t.empty() && v <= t.back())) break;
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return t;
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double to_unit(double v) const {  // [0, 1] along the axis
    if (log) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v * 0.5 - lo * 0.5) / (hi * 0.5 - lo * 0.5);  // halves: hi - lo may pass the largest double
  }
};

// The range of the values, padded 5% so no line sits on the frame; a flat
// series gets a band around its value.
Axis y_axis(const PlotSpec& spec) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const PlotSeries& s : spec.series)
    for (const auto& [x, y] : s.points) {
      if (spec.log_y && y <= 0) continue;
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  Axis a;
  a.log = spec.log_y;
  if (!std::isfinite(lo)) {  // nothing to show (on a log axis: no value above 0)
    if (a.log) a.lo = 1, a.hi = 10;
    return a;
  }
  if (a.log) {  // kept within normal, finite doubles so the logarithms are finite
    a.lo = std::max(lo / 1.5, std::numeric_limits<double>::min());
    a.hi = std::min(hi * 1.5, std::numeric_limits<double>::max());
    if (a.hi <= a.lo) a.hi = a.lo * 10;
    return a;
  }
  if (hi - lo <= std::abs(hi) * 1e-9) {
    const double pad = hi != 0 ? std::abs(hi) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  } else {
    const double pad = (hi * 0.5 - lo * 0.5) * 0.1;
    // Non-negative figures keep a floor at 0 when they come near it.
    lo = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
    hi += pad;
  }
  constexpr double kMax = std::numeric_limits<double>::max();
  a.lo = std::max(lo, -kMax);
  a.hi = std::min(hi, kMax);
  return a;
}

std::vector<double> y_ticks(const Axis& a) {
  if (!a.log) return linear_ticks(a.lo, a.hi);
  std::vector<double> t;
  const double e0 = std::ceil(std::log10(a.lo)), e1 = std::floor(std::log10(a.hi));
  for (double e = e0; e <= e1 && t.size() < 700; e += 1) t.push_back(std::pow(10.0, e));
  if (t.size() < 2) {  // less than a decade: linear steps, placed logarithmically
    t.clear();
    for (double v : linear_ticks(a.lo, a.hi))
      if (v > 0) t.push_back(v);
  }
  return t;
}

}  // namespace

std::vector<std::pair<double, double>> thin_points(const std::vector<std::pair<double, double>>& pts,
                                                   size_t max_points) {
  if (pts.size() <= max_points || max_points < 4) return pts;
  const size_t buckets = max_points / 2;
  std::vector<std::pair<double, double>> out;
  out.reserve(buckets * 2 + 1);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t from = b * pts.size() / buckets, to = (b + 1) * pts.size() / buckets;
    if (from >= to) continue;
    size_t lo = from, hi = from;
    for (size_t i = from; i < to; ++i) {
      if (pts[i].second < pts[lo].second) lo = i;
      if (pts[i].second > pts[hi].second) hi = i;
    }
    out.push_back(pts[std::min(lo, hi)]);
    if (lo != hi) out.push_back(pts[std::max(lo, hi)]);
  }
  if (out.back() != pts.back()) out.push_back(pts.back());  // the last value is the one people read
  return out;
}

std::string short_number(double v) {
  char buf[32];
  const double a = std::abs(v);
  if (v == 0) return "0";
  // The unit is chosen for the value as rounded: 999700 is "1M", not "1e+03k".
  if (a >= 999.5e6) std::snprintf(buf, sizeof buf, "%.3gG", v / 1e9);
  else if (a >= 999.5e3) std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  else if (a >= 9999.5) std::snprintf(buf, sizeof buf, "%.3gk", v / 1e3);
  else if (a >= 0.01) std::snprintf(buf, sizeof buf, "%.4g", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string svg_line_plot(const PlotSpec& spec) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  size_t total = 0;
  for (const PlotSeries& s : spec.series)
    for (const auto& p : s.points) {
      x_lo = std::min(x_lo, p.first);
      x_hi = std::max(x_hi, p.first);
      ++total;
    }
  std::string o = "<svg class=\"plot\" id=\"" + html_escape(spec.id) + "\" viewBox=\"0 0 " + f1(kW) + " " + f1(kH) +
                  "\" role=\"img\" aria-label=\"" + html_escape(spec.title) + "\">";
  o += "<text class=\"title\" x=\"" + f1(kLeft) + "\" y=\"18\">" + html_escape(spec.title) + "</text>";
  o += "<rect class=\"frame\" x=\"" + f1(kLeft) + "\" y=\"" + f1(kTop) + "\" width=\"" + f1(kPw) + "\" height=\"" +
       f1(kPh) + "\"/>";
  if (total == 0) {
    o += "<text class=\"empty\" x=\"" + f1(kLeft + kPw / 2) + "\" y=\"" + f1(kTop + kPh / 2) + "\">no data</text></svg>";
    return o;
  }
  if (x_hi <= x_lo) {  // one step: centre it
    x_lo -= 1;
    x_hi += 1;
  }
  const Axis y = y_axis(spec);
  auto px = [&](double x) { return kLeft + (x - x_lo) / (x_hi - x_lo) * kPw; };
  auto py = [&](double v) { return kTop + (1.0 - y.to_unit(v)) * kPh; };

  // Grid and tick labels.
  for (double t : y_ticks(y)) {
    const double yy = py(t);
    if (yy < kTop - 0.5 || yy > kTop + kPh + 0.5) continue;
    o += "<line class=\"grid\" x1=\"" + f1(kLeft) + "\" x2=\"" + f1(kLeft + kPw) + "\" y1=\"" + f1(yy) + "\" y2=\"" +
         f1(yy) + "\"/>";
    o += "<text class=\"tick y\" x=\"" + f1(kLeft - 6) + "\" y=\"" + f1(yy + 4) + "\">" + short_number(t) + "</text>";
  }
  for (double t : linear_ticks(x_lo, x_hi)) {
    const double xx = px(t);
    o += "<line class=\"grid\" x1=\"" + f1(xx) + "\" x2=\"" + f1(xx) + "\" y1=\"" + f1(kTop) + "\" y2=\"" +
         f1(kTop + kPh) + "\"/>";
    o += "<text class=\"tick x\" x=\"" + f1(xx) + "\" y=\"" + f1(kTop + kPh + 16) + "\">" + short_number(t) + "</text>";
  }
  o += "<text class=\"axis x\" x=\"" + f1(kLeft + kPw / 2) + "\" y=\"" + f1(kH - 6) + "\">step</text>";
  o += "<text class=\"axis y\" transform=\"translate(14," + f1(kTop + kPh / 2) + ") rotate(-90)\">" +
       html_escape(spec.y_label) + (spec.log_y ? " (log)" : "") + "</text>";

  for (const PlotSeries& s : spec.series) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& p : s.points)
      if (!spec.log_y || p.second > 0) pts.push_back(p);
    if (pts.empty()) continue;
    pts = thin_points(pts);
    const auto& last = pts.back();
    o += "<g class=\"series-group " + html_escape(s.css_class) + "\">";
    if (s.line) {
      std::string d;
      d.reserve(pts.size() * 14);
      for (size_t i = 0; i < pts.size(); ++i) d += (i ? " L" : "M") + f1(px(pts[i].first)) + " " + f1(py(pts[i].second));
      o += "<path class=\"series\" d=\"" + d + "\" stroke=\"" + s.color + "\"" +
           (s.dashed ? " stroke-dasharray=\"5 3\"" : "") + " data-points=\"" + std::to_string(pts.size()) +
           "\"><title>" + html_escape(s.label) + ": " + std::to_string(s.points.size()) + " points, step " +
           short_number(last.first) + ": " + short_number(last.second) + "</title></path>";
    }
    if (s.markers || !s.line || pts.size() < kMarkerBelow) {
      for (const auto& [x, v] : pts)
        o += "<circle class=\"marker\" cx=\"" + f1(px(x)) + "\" cy=\"" + f1(py(v)) + "\" r=\"" + (s.line ? "2.5" : "4") +
             "\" fill=\"" + (s.line ? s.color : "none") + "\" stroke=\"" + s.color + "\"><title>" +
             html_escape(s.label) + ", step " + short_number(x) + ": " + short_number(v) + "</title></circle>";
    }
    o += "</g>";
  }
  o += "</svg>";
  return o;
}

}  // namespace brisk::monitor
