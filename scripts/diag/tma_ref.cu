// Reference TMA load in CUDA C++: the same PTX numbatc emits, with the tensor map passed as a
// __grid_constant__ parameter (k_param) and from global memory (k_global).  Used to tell a
// numbatc bug from a hardware or driver rule.  Build: nvcc -arch=sm_90a tma_ref.cu -lcuda
// Run: ./a.out VARIANT [INNERMOST_START]  (start in float32 elements, default 4 = 16 bytes).
// NOTE (the lent H200, 2026-12-01): starts of 0, 4, 8, -4 run exactly; 3, 1, 90 (not a multiple
// of 16 bytes) raise an illegal instruction.  This file's old fixed start of 3 is what made
// every variant fault.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <cstdlib>

__constant__ int X0;  // the box's innermost start (elements)

template <bool FENCE, bool CTA_DST>
__device__ void body(const void* map, float* out) {
  __shared__ alignas(1024) float tile[16 * 16];
  __shared__ alignas(8) uint64_t bar;
  uint32_t s = (uint32_t)__cvta_generic_to_shared(tile);
  uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (FENCE) asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" :: "l"(map) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(1024) : "memory");
    if (CTA_DST)
      asm volatile("cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                   :: "r"(s), "l"(map), "r"(X0), "r"(5), "r"(b) : "memory");
    else
      asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                   :: "r"(s), "l"(map), "r"(X0), "r"(5), "r"(b) : "memory");
  }
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0; @!p bra W; }" :: "r"(b) : "memory");
  for (int i = threadIdx.x; i < 256; i += blockDim.x) out[i] = tile[i];
}
__global__ void k_param(const __grid_constant__ CUtensorMap map, float* out) { body<false, false>(&map, out); }
__global__ void k_param_cta(const __grid_constant__ CUtensorMap map, float* out) { body<false, true>(&map, out); }
__global__ void k_global(const CUtensorMap* map, float* out) { body<false, false>(map, out); }
__global__ void k_global_fence(const CUtensorMap* map, float* out) { body<true, false>(map, out); }

int main(int argc, char** argv) {
  const int R = 48, C = 96;
  float h[R * C];
  for (int i = 0; i < R * C; i++) h[i] = (float)i;
  float *d, *out; CUtensorMap* dmap;
  cudaMalloc(&d, sizeof h); cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  cudaMalloc(&out, 256 * 4); cudaMalloc(&dmap, sizeof(CUtensorMap));
  CUtensorMap map;
  cuuint64_t dims[2] = {C, R}, strides[1] = {C * 4};
  cuuint32_t box[2] = {16, 16}, es[2] = {1, 1};
  CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, d, dims, strides, box, es,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  printf("encode: %d\n", (int)r);
  cudaMemcpy(dmap, &map, sizeof map, cudaMemcpyHostToDevice);
  int v = argc > 1 ? atoi(argv[1]) : 0;
  int x0 = argc > 2 ? atoi(argv[2]) : 4;
  cudaMemcpyToSymbol(X0, &x0, sizeof x0);
  const char* names[] = {"param", "param-cta-dst", "global", "global-fence", "param-cluster1"};
  {
    cudaMemset(out, 0, 1024);
    if (v == 0) k_param<<<1, 128>>>(map, out);
    else if (v == 1) k_param_cta<<<1, 128>>>(map, out);
    else if (v == 2) k_global<<<1, 128>>>(dmap, out);
    else if (v == 3) k_global_fence<<<1, 128>>>(dmap, out);
    else {
      cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(1); cfg.blockDim = dim3(128);
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
      cfg.attrs = at; cfg.numAttrs = 1;
      cudaLaunchKernelEx(&cfg, k_param, map, out);
    }
    cudaError_t e = cudaDeviceSynchronize();
    float o[256]; cudaMemcpy(o, out, 1024, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) bad += o[i * 16 + j] != h[(5 + i) * C + x0 + j];
    printf("%s, innermost start %d: %s, %d wrong; map words %016llx %016llx\n", names[v], x0, cudaGetErrorString(e), bad,
           ((unsigned long long*)&map)[0], ((unsigned long long*)&map)[1]);
    if (e) return 1;
  }
  return 0;
}
