// Minimal stand-in for Vitis HLS's <hls_stream.h>, used when the vendor headers are absent.
// Only what the cxlkv kernel uses: hls::stream<T> with read(), write(), empty(), size().
// Semantics follow C simulation: an unbounded FIFO; reading an empty stream is a bug (abort).
#ifndef CXLKV_HLS_COMPAT_STREAM_H
#define CXLKV_HLS_COMPAT_STREAM_H

#include <cstdio>
#include <cstdlib>
#include <deque>

namespace hls {

template <typename T>
class stream {
  public:
    stream() = default;
    explicit stream(const char*) {}
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;

    void write(const T& v) { q_.push_back(v); }
    T read() {
        if (q_.empty()) {
            std::fprintf(stderr, "hls_compat: read from an empty stream\n");
            std::abort();
        }
        T v = q_.front();
        q_.pop_front();
        return v;
    }
    bool empty() const { return q_.empty(); }
    std::size_t size() const { return q_.size(); }

  private:
    std::deque<T> q_;
};

}  // namespace hls

#endif
