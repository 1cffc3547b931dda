// A Llama-family decoder layer on k-quant blocks in two calls: before the cache update (norm, q/k/v,
// rotary embedding) and after it (attention, output projection, residual + norm, gate/up, gated
// activation, down projection, residual).
//
// Why: the layer's steps were already one C++ call each (invariant.cpp's row-wise steps, kquants.cpp's
// projections), but ten calls a layer from Python, with their argument lists and the tensors passed
// between them, cost ~2 ms of the 0.5B draft's ~7 ms one-token step. The steps are the same functions
// in the same order, so the bits are those of the per-step path: every row still computed whole, in
// one fixed order, whatever M is.
//
// The two kernel files are compiled into this module, each in a namespace of its own (both keep
// their helpers in anonymous namespaces under the same names); their headers are included here
// first, so the includes inside the namespaces are no-ops.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "host.h"
#include "split.h"

#define HARNESS_KERNELS_ONLY
namespace inv {
#include "invariant.cpp"
}
#undef AVX512
#undef AVX2
namespace kq {
#include "kquants.cpp"
}

namespace {

using torch::Tensor;

// Several k-quant weights applied to one input, as kquants' `linears` takes them.
struct Projection {
  std::vector<Tensor> blocks;
  std::vector<std::string> kinds;
  std::vector<int64_t> ns;
  std::vector<c10::optional<Tensor>> biases;

  std::vector<Tensor> operator()(const Tensor& x) const { return kq::linears(x, blocks, kinds, ns, biases, false, -1); }
};

// Each thread starts pulling in what it reads next while the memory would otherwise idle, issued just
// before attention: first the keys of the tiles attention's scores pass hands it (`even_share` of
// them, up to inv::SHARED_ROWS rows), which it reads first; then its share of the output
// projection's weights (`even_share` of its groups, the ones it claims first). Why the keys:
// attention streamed a layer's cache at a fraction of the read bandwidth, its requests a few keys
// ahead of its arithmetic; asked for at once, they come at the stream's rate (into L2, the rest into
// L3 as L2 lets them go), and the scores pass then runs at about the speed it has on a cache already
// held.
// On a 2-core AMD EPYC Zen 4 (family 25 model 17), toggled forward by forward in one process, outputs
// equal: the warm and attention together took 0.90-0.94x their time at 200-4,096 cached tokens, the
// 1.5B target's one-token forward 0.94-0.99x; two builds alternated read 0.99-1.00x at one row and
// 0.986-0.995x at four (within that comparison's +-2%).
// ``keys``: head h's L keys of ``dim`` floats are at keys + h * head_stride onwards, one after the
// other; ``rows``: the rows being computed, the last of the L (past SHARED_ROWS attention splits its
// work otherwise, and a prompt's chunk is bound by its arithmetic: no keys asked for).
void warm(const Projection& p, const float* keys, int64_t kv_heads, int64_t head_stride, int64_t L, int64_t dim,
          int64_t rows) {
  const Tensor& w = p.blocks[0];
  const int64_t groups = w.size(0), row = w.size(1);
  const char* base = reinterpret_cast<const char*>(w.data_ptr<uint8_t>());
  // The scores pass's units: each key/value head's keys that every row sees, in tiles.
  const int64_t common = L - rows + 1;
  const bool with_keys = keys != nullptr && rows <= inv::SHARED_ROWS && common > 0;
  const int64_t tiles = with_keys ? (common + inv::KEY_TILE - 1) / inv::KEY_TILE : 0;
#pragma omp parallel
  {
    const int64_t n = omp_get_num_threads(), t = omp_get_thread_num();
    if (with_keys) {
      const auto [first, last] = even_share(kv_heads * tiles, t, n);
      for (int64_t u = first; u < last; ++u) {
        const int64_t h = u / tiles, k0 = (u % tiles) * inv::KEY_TILE, k1 = std::min(common, k0 + inv::KEY_TILE);
        const char* tile = reinterpret_cast<const char*>(keys + h * head_stride + k0 * dim);
        const int64_t bytes = (k1 - k0) * dim * static_cast<int64_t>(sizeof(float));
        for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(tile + i, _MM_HINT_T0);
      }
    }
    const auto [g0, g1] = even_share(groups, t, n);
    for (int64_t i = g0 * row; i < g1 * row; i += 64) _mm_prefetch(base + i, _MM_HINT_T1);
  }
}

struct Layer {
  int64_t heads, kv_heads, dim;
  double scaling;
  Tensor in_w;
  double in_eps;
  Tensor post_w;
  double post_eps;
  Projection qkv, o, gate_up, down;

  // x [M, width] (contiguous), the rotary tables as the per-step path reads them (``tables``): q
  // [M, heads * dim], and the new keys and values as [1, kv_heads, M, dim] views, the cache's layout.
  std::vector<Tensor> begin(const Tensor& x, const Tensor& cos, const Tensor& sin) const {
    auto p = qkv(inv::rms_norm(x, in_w, in_eps));
    inv::rope_(p[0], cos, sin, heads);
    inv::rope_(p[1], cos, sin, kv_heads);
    const int64_t m = x.size(0);
    return {p[0], p[1].view({1, m, kv_heads, dim}).transpose(1, 2),
            p[2].view({1, m, kv_heads, dim}).transpose(1, 2)};
  }

  // The rest of the layer, onto keys and values [1, kv_heads, L, dim] (the cache, this step's rows
  // last): the layer's output [M, width].
  // ``visible``: a token tree's mask over the cache's last entries (inv::attention_md).
  Tensor end(const Tensor& x, const Tensor& q, const Tensor& keys, const Tensor& values,
             c10::optional<Tensor> visible) const {
    const bool rows_packed = keys.dim() == 4 && keys.scalar_type() == torch::kFloat32 && keys.stride(3) == 1 &&
                             keys.stride(2) == dim;
    // Keys of another layout or type ask for nothing here; attention_md says what is wrong with them.
    warm(o, rows_packed ? keys.data_ptr<float>() : nullptr, kv_heads, rows_packed ? keys.stride(1) : 0,
         rows_packed ? keys.size(2) : 0, dim, q.size(0));
    return rest(x, inv::attention_md(q, keys.select(0, 0), values.select(0, 0), heads, scaling, visible));
  }

  // ``end`` on the first L rows of cache buffers [1, kv_heads, capacity, dim] (contiguous float32),
  // read in place: attention_md's call of attend, without its checks and views of the cache (the
  // stack checked the buffers once), so the same bits. A token tree's mask takes ``end``.
  Tensor end_on(const Tensor& x, const Tensor& q, const Tensor& kbuf, const Tensor& vbuf, int64_t L,
                const c10::optional<Tensor>& visible) const {
    if (visible.has_value()) return end(x, q, kbuf.narrow(2, 0, L), vbuf.narrow(2, 0, L), visible);
    TORCH_CHECK(q.is_contiguous() && q.size(1) == heads * dim, "q must be contiguous [M, heads * dim]");
    warm(o, kbuf.data_ptr<float>(), kv_heads, kbuf.stride(1), L, dim, q.size(0));
    const int64_t m = q.size(0), width = heads * dim;
    auto out = torch::empty({m, width}, q.options());
    inv::attend(q.data_ptr<float>(), dim, width, kbuf.data_ptr<float>(), kbuf.stride(1), vbuf.data_ptr<float>(),
                vbuf.stride(1), out.data_ptr<float>(), dim, width, heads, m, dim, kv_heads, L,
                static_cast<float>(scaling));
    return rest(x, out);
  }

  // After attention: the output projection, residual + norm, gate/up, the gated activation, down,
  // residual.
  Tensor rest(const Tensor& x, const Tensor& attended) const {
    auto attn = o(attended);
    auto xh = inv::add_rms_norm(x, attn[0], post_w, post_eps);
    auto gu = gate_up(xh[1]);
    auto d = down(inv::silu_mul(gu[0], gu[1]));
    return xh[0].add_(d[0]);
  }
};

// Rows [1, kv_heads, M, dim] (a view with unit stride along dim) written as rows n.. of a cache
// buffer [1, kv_heads, capacity, dim]: the copy copy_ makes, without its dispatch.
void write_rows(const Tensor& buf, const Tensor& rows, int64_t n) {
  TORCH_CHECK(rows.scalar_type() == torch::kFloat32 && rows.stride(3) == 1, "rows must be float32, unit stride along dim");
  const int64_t kv = rows.size(1), m = rows.size(2), d = rows.size(3);
  const float* src = rows.data_ptr<float>();
  float* dst = buf.data_ptr<float>();
  for (int64_t h = 0; h < kv; ++h)
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(dst + h * buf.stride(1) + (n + r) * d, src + h * rows.stride(1) + r * rows.stride(2),
                  sizeof(float) * d);
}

// The model's rotary tables [1, M, dim]: their first row block in float32, as the per-step path reads
// them.
std::pair<Tensor, Tensor> tables(const Tensor& cos_table, const Tensor& sin_table) {
  return {cos_table.select(0, 0).to(torch::kFloat32).contiguous(),
          sin_table.select(0, 0).to(torch::kFloat32).contiguous()};
}

// The decoder stack's layers, one after the other, with each layer's cache update in between: the
// calls of the layer-by-layer loop in its order (the same bits). Why: that loop spent tens of us of
// Python a layer around its two calls (the cache's checks and views, the calls' arguments) while the
// second core spun waiting; interleaved in one process on a 2-core AMD EPYC Zen 4, the one call made
// the 1.5B target's one-token step 3-9% faster and the 0.5B draft's 2-3%.
struct Stack {
  std::vector<Layer> layers;

  // x [M, width], the rotary tables [1, M, dim]; ``keys``/``values``: each layer's cache buffer
  // [1, kv_heads, capacity, dim] holding its first ``n`` rows, with room for M more, which this
  // writes: the last layer's output [M, width].
  Tensor forward(Tensor x, const Tensor& cos_table, const Tensor& sin_table, const std::vector<Tensor>& keys,
                 const std::vector<Tensor>& values, int64_t n, c10::optional<Tensor> visible) const {
    TORCH_CHECK(keys.size() == layers.size() && values.size() == layers.size(), "one cache buffer a layer");
    const auto [cos, sin] = tables(cos_table, sin_table);
    const int64_t m = x.size(0);
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& layer = layers[i];
      for (const Tensor* buf : {&keys[i], &values[i]})
        TORCH_CHECK(buf->dim() == 4 && buf->size(0) == 1 && buf->size(1) == layer.kv_heads &&
                        buf->size(2) >= n + m && buf->size(3) == layer.dim && buf->is_contiguous() &&
                        buf->scalar_type() == torch::kFloat32,
                    "a cache buffer must be a contiguous float32 [1, kv_heads, capacity, dim] with room for the rows");
      auto qkv = layer.begin(x, cos, sin);
      write_rows(keys[i], qkv[1], n);
      write_rows(values[i], qkv[2], n);
      x = layer.end_on(x, qkv[0], keys[i], values[i], n + m, visible);
    }
    return x;
  }

  // ``forward`` onto caches as a Python cache holds them: ``held_keys``/``held_values``, each layer's
  // keys and values now, and ``buf_keys``/``buf_values``, the buffers they should be the first rows
  // of. Where every layer's are (as the stack left them, or cropped since), all with one count n and
  // room for M more: the last layer's output and each layer's first n + M rows as views, to hold
  // next; otherwise nothing is run (the caller grows the buffers). Why here: checked and viewed
  // from Python, the cache cost ~14 us a layer of the 0.5B draft's ~10 ms step on a 2-core AMD
  // EPYC Zen 4, its second core waiting.
  std::optional<std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>>> forward_held(
      const Tensor& x, const Tensor& cos_table, const Tensor& sin_table, const std::vector<Tensor>& held_keys,
      const std::vector<Tensor>& held_values, const std::vector<Tensor>& buf_keys,
      const std::vector<Tensor>& buf_values, const c10::optional<Tensor>& visible) const {
    const size_t count = layers.size();
    TORCH_CHECK(held_keys.size() == count && held_values.size() == count && buf_keys.size() == count &&
                    buf_values.size() == count,
                "one cache a layer");
    const int64_t m = x.size(0);
    int64_t n = -1;
    for (size_t i = 0; i < count; ++i)
      for (const auto& [held, buf] : {std::pair{&held_keys[i], &buf_keys[i]}, std::pair{&held_values[i], &buf_values[i]}}) {
        if (held->dim() != 4 || buf->dim() != 4 || held->data_ptr() != buf->data_ptr() ||
            held->strides() != buf->strides() || held->size(0) != buf->size(0) || held->size(1) != buf->size(1) ||
            held->size(3) != buf->size(3) || held->size(2) + m > buf->size(2) || (n >= 0 && held->size(2) != n))
          return std::nullopt;
        n = held->size(2);
      }
    Tensor out = forward(x, cos_table, sin_table, buf_keys, buf_values, n, visible);
    std::vector<Tensor> keys, values;
    keys.reserve(count);
    values.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      keys.push_back(buf_keys[i].narrow(2, 0, n + m));
      values.push_back(buf_values[i].narrow(2, 0, n + m));
    }
    return std::make_tuple(out, keys, values);
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &inv::rms_norm, "row-wise RMS norm in one fixed order (invariant.cpp's)", py::arg("x"),
        py::arg("w"), py::arg("eps"));
  py::class_<Projection>(m, "Projection", "k-quant weights applied to one input, quantized once")
      .def(py::init<std::vector<Tensor>, std::vector<std::string>, std::vector<int64_t>,
                    std::vector<c10::optional<Tensor>>>(),
           py::arg("blocks"), py::arg("kinds"), py::arg("ns"), py::arg("biases"))
      .def("__call__", &Projection::operator(), py::arg("x"));
  py::class_<Layer>(m, "Layer", "a decoder layer's weights and sizes, for its two calls")
      .def(py::init<int64_t, int64_t, int64_t, double, Tensor, double, Tensor, double, Projection, Projection,
                    Projection, Projection>(),
           py::arg("heads"), py::arg("kv_heads"), py::arg("dim"), py::arg("scaling"), py::arg("in_w"),
           py::arg("in_eps"), py::arg("post_w"), py::arg("post_eps"), py::arg("qkv"), py::arg("o"),
           py::arg("gate_up"), py::arg("down"))
      .def(
          "begin",
          [](const Layer& layer, const Tensor& x, const Tensor& cos_table, const Tensor& sin_table) {
            const auto [cos, sin] = tables(cos_table, sin_table);
            return layer.begin(x, cos, sin);
          },
          "norm, q/k/v, rotary embedding (the model's tables [1, M, dim]): q, keys, values", py::arg("x"),
          py::arg("cos"), py::arg("sin"))
      .def("end", &Layer::end, "attention onto the cache, and the rest of the layer", py::arg("x"), py::arg("q"),
           py::arg("keys"), py::arg("values"), py::arg("visible") = py::none());
  py::class_<Stack>(m, "Stack", "a decoder stack's layers, run one after the other onto their caches")
      .def(py::init<std::vector<Layer>>(), py::arg("layers"))
      .def("forward", &Stack::forward, "every layer onto its cache buffer: the last layer's output", py::arg("x"),
           py::arg("cos"), py::arg("sin"), py::arg("keys"), py::arg("values"), py::arg("n"),
           py::arg("visible") = py::none())
      .def("forward_held", &Stack::forward_held,
           "forward onto caches held as the first rows of their buffers: (output, keys, values) or None",
           py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("held_keys"), py::arg("held_values"),
           py::arg("buf_keys"), py::arg("buf_values"), py::arg("visible") = py::none());
}
