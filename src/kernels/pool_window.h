// The average-pooling window rule (PyTorch's), shared by the reference and fast pooling kernels.
#pragma once
#include <algorithm>

#include "kernels/kernels.h"

namespace mixprec::kernels {

// Input rows [y0, y1) and columns [x0, x1) of output (oy, ox), and what their sum is divided by.
struct AvgWindow {
  int64_t y0, y1, x0, x1, divisor;
};

inline AvgWindow avg_window(const PoolGeometry& g, int64_t oy, int64_t ox) {
  AvgWindow win{};
  if (g.adaptive) {
    // floor(i*h/oh) .. ceil((i+1)*h/oh)
    win.y0 = oy * g.h / g.oh;
    win.y1 = ((oy + 1) * g.h + g.oh - 1) / g.oh;
    win.x0 = ox * g.w / g.ow;
    win.x1 = ((ox + 1) * g.w + g.ow - 1) / g.ow;
    win.divisor = (win.y1 - win.y0) * (win.x1 - win.x0);
    return win;
  }
  // The window may hang over the padding (counted when count_include_pad) and, in ceil mode, past
  // it (never counted): PyTorch clips the end to h + pad before taking the size.
  int64_t y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
  int64_t y1 = std::min(y0 + g.kh, g.h + g.pad_h), x1 = std::min(x0 + g.kw, g.w + g.pad_w);
  const int64_t padded = (y1 - y0) * (x1 - x0);
  win.y0 = std::max<int64_t>(y0, 0);
  win.x0 = std::max<int64_t>(x0, 0);
  win.y1 = std::min(y1, g.h);
  win.x1 = std::min(x1, g.w);
  win.divisor = g.count_include_pad ? padded : (win.y1 - win.y0) * (win.x1 - win.x0);
  return win;
}

}  // namespace mixprec::kernels
