// Dispatch of a kernel over a grid: dispatchThreads semantics (the edge threadgroups of a
// grid that is not a multiple of the threadgroup size are smaller, as on Apple GPUs).
#pragma once

namespace eb {
struct Ids {
  uint3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid;
  uint3 threads_per_threadgroup, threadgroups_per_grid, threads_per_grid, dispatch_threads_per_threadgroup;
  uint thread_index_in_threadgroup, thread_index_in_simdgroup, simdgroup_index_in_threadgroup;
  uint threads_per_simdgroup, simdgroups_per_threadgroup, thread_execution_width;
};

struct Grid {
  uint3 threads, group;  // threads per grid, threads per (full) threadgroup
  uint3 groups() const { return uint3((threads.x + group.x - 1) / group.x, (threads.y + group.y - 1) / group.y,
                                      (threads.z + group.z - 1) / group.z); }
  uint group_count() const { uint3 g = groups(); return g.x * g.y * g.z; }
  uint lanes() const { return group.x * group.y * group.z; }
  uint3 group_position(uint g) const { uint3 n = groups(); return uint3(g % n.x, (g / n.x) % n.y, g / (n.x * n.y)); }
  uint3 group_size(uint3 pos) const {  // the edge groups are clipped to the grid
    return uint3(std::min(group.x, threads.x - pos.x * group.x), std::min(group.y, threads.y - pos.y * group.y),
                 std::min(group.z, threads.z - pos.z * group.z));
  }
  // The ids of lane `l` (row-major in the full group shape) of group `g`; false if clipped away.
  bool ids(uint g, uint l, Ids& id) const {
    uint3 pos = group_position(g), size = group_size(pos);
    uint3 local(l % group.x, (l / group.x) % group.y, l / (group.x * group.y));
    if (local.x >= size.x || local.y >= size.y || local.z >= size.z) return false;
    id.thread_position_in_threadgroup = local;
    id.threadgroup_position_in_grid = pos;
    id.thread_position_in_grid = uint3(pos.x * group.x + local.x, pos.y * group.y + local.y, pos.z * group.z + local.z);
    id.threads_per_threadgroup = size;
    id.dispatch_threads_per_threadgroup = group;
    id.threadgroups_per_grid = groups();
    id.threads_per_grid = threads;
    id.thread_index_in_threadgroup = local.x + size.x * (local.y + size.y * local.z);
    id.thread_index_in_simdgroup = id.thread_index_in_threadgroup % kSimdWidth;
    id.simdgroup_index_in_threadgroup = id.thread_index_in_threadgroup / kSimdWidth;
    id.threads_per_simdgroup = id.thread_execution_width = kSimdWidth;
    uint active = size.x * size.y * size.z;
    id.simdgroups_per_threadgroup = (active + kSimdWidth - 1) / kSimdWidth;
    return true;
  }
  uint active_lanes(uint g) const { uint3 s = group_size(group_position(g)); return s.x * s.y * s.z; }
};

// Cooperative lanes: one OS thread per lane of a threadgroup, the pool reused for every group.
template <class Kernel> void dispatch_cooperative(const Grid& grid, Kernel kernel) {
  const uint lanes = grid.lanes(), groups = grid.group_count();
  Barrier group_barrier, pool;
  std::vector<SimdGroup> simd((lanes + kSimdWidth - 1) / kSimdWidth);
  pool.expected = int(lanes);
  pool.what = "the end of a threadgroup";
  auto prepare = [&](uint g) {  // runs while every lane waits between two groups
    uint active = grid.active_lanes(g);
    group_barrier.reset(int(active));
    for (uint s = 0; s < simd.size(); ++s) {
      int size = int(std::min<uint>(kSimdWidth, active > s * kSimdWidth ? active - s * kSimdWidth : 0));
      simd[s].size = size;
      simd[s].barrier.reset(size);
      simd[s].barrier.what = "a SIMD-group function or simdgroup_barrier";
    }
  };
  if (groups) prepare(0);
  auto run_lane = [&](uint l) {
    for (uint g = 0; g < groups; ++g) {
      Ids id;
      if (grid.ids(g, l, id)) {
        lane.threadgroup = &group_barrier;
        lane.simd = &simd[id.simdgroup_index_in_threadgroup];
        lane.simd_lane = int(id.thread_index_in_simdgroup);
        kernel(id);
        lane.simd->barrier.lane_exited();
        group_barrier.lane_exited();
      }
      pool.arrive_and_wait([&] { if (g + 1 < groups) prepare(g + 1); });
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(lanes);
  for (uint l = 0; l < lanes; ++l) threads.emplace_back(run_lane, l);
  for (auto& t : threads) t.join();
}

// Independent lanes (the kernel uses no barrier, SIMD-group function or threadgroup memory):
// a few workers take whole threadgroups and run their lanes one after another.
template <class Kernel> void dispatch_independent(const Grid& grid, Kernel kernel, uint workers) {
  const uint lanes = grid.lanes(), groups = grid.group_count();
  std::atomic<uint> next{0};
  auto work = [&] {
    for (uint g = next.fetch_add(1); g < groups; g = next.fetch_add(1)) {
      for (uint l = 0; l < lanes; ++l) {
        Ids id;
        if (grid.ids(g, l, id)) kernel(id);
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint w = 0; w < std::max(1u, workers); ++w) threads.emplace_back(work);
  for (auto& t : threads) t.join();
}

// -- the harness's I/O: buffers from files, outputs back to files ---------------------------
struct Buffer {
  std::vector<std::max_align_t> storage;
  size_t bytes = 0;
  std::string out_path;
  void* data() { return storage.data(); }
  void allocate(size_t n) { bytes = n; storage.assign(std::max<size_t>(1, (n + 15) / sizeof(std::max_align_t) + 1), {}); }
};

inline Buffer read_buffer(const char* path) {
  Buffer b;
  FILE* f = std::fopen(path, "rb");
  if (!f) fail("cannot open an input buffer file");
  std::fseek(f, 0, SEEK_END);
  long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  b.allocate(size_t(n));
  if (n && std::fread(b.data(), 1, size_t(n), f) != size_t(n)) fail("short read of an input buffer");
  std::fclose(f);
  return b;
}

// Argument specs: "r:PATH" an input buffer, "w:BYTES:PATH" an output (filled with 0xFF so an
// unwritten element shows as NaN), "t:BYTES" threadgroup memory.
inline Buffer make_buffer(const char* spec) {
  if (spec[0] == 'r') return read_buffer(spec + 2);
  Buffer b;
  char* end = nullptr;
  b.allocate(std::strtoull(spec + 2, &end, 10));
  std::memset(b.data(), spec[0] == 'w' ? 0xFF : 0, b.bytes);
  if (spec[0] == 'w') b.out_path = end + 1;
  return b;
}

inline void write_outputs(std::vector<Buffer>& buffers) {
  for (auto& b : buffers) {
    if (b.out_path.empty()) continue;
    FILE* f = std::fopen(b.out_path.c_str(), "wb");
    if (!f || std::fwrite(b.data(), 1, b.bytes, f) != b.bytes) fail("cannot write an output buffer");
    std::fclose(f);
  }
}
}  // namespace eb
