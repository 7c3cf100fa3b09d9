// g++ harness of tightfit/kernels/cuda/attn_q.cuh (tests/test_attn_decode_q_cuda.py builds it
// with -DTF_HOST and the format macros). Usage: attn_q_host DIR Hkv GRP NCH NL CHUNK MINR
// qk_scale split capacity; reads DIR/{q_rot,kc,vc,kcb,vcb,status}.bin, writes DIR/{o,m,l,acc}.bin.
#define TF_HOST 1
#include "attn_q.cuh"
#include <cstdio>
#include <cstdlib>
#include <string>

static std::vector<u8> rd(const std::string& p) {
    FILE* f = std::fopen(p.c_str(), "rb");
    if (!f) { std::perror(p.c_str()); std::exit(2); }
    std::fseek(f, 0, SEEK_END); long n = std::ftell(f); std::fseek(f, 0, SEEK_SET);
    std::vector<u8> b(n + 16);
    if (std::fread(b.data(), 1, n, f) != (size_t)n) std::exit(3);
    std::fclose(f);
    return b;
}
static void wr(const std::string& p, const void* d, size_t n) {
    FILE* f = std::fopen(p.c_str(), "wb"); std::fwrite(d, 1, n, f); std::fclose(f);
}

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "--smem") {    // the build's layout constants
        std::printf("%d %d\n", (int)TF_SMEM_BYTES, (int)TF_ACC_RS);
        return 0;
    }
    if (argc != 11) { std::fprintf(stderr, "bad args\n"); return 1; }
    std::string dir = argv[1];
    int Hkv = std::atoi(argv[2]), GRP = std::atoi(argv[3]), NCH = std::atoi(argv[4]),
        NL = std::atoi(argv[5]), CHUNK = std::atoi(argv[6]), MINR = std::atoi(argv[7]);
    float qk_scale = (float)std::atof(argv[8]);
    int split = std::atoi(argv[9]);
    (void)argv[10];
    auto q = rd(dir + "/q_rot.bin"), kc = rd(dir + "/kc.bin"), vc = rd(dir + "/vc.bin"),
         kcb = rd(dir + "/kcb.bin"), vcb = rd(dir + "/vcb.bin"), st = rd(dir + "/status.bin");
    int H = Hkv * GRP;
    std::vector<float> o((size_t)H * HD, 0.f), m((size_t)H * NCH, 0.f), l((size_t)H * NCH, 0.f),
        acc((size_t)H * NCH * HD, 0.f);
    int smem = TF_SMEM_BYTES;
    std::vector<u8> sm(smem + 16);
    for (int by = 0; by < Hkv; by++)
        for (int bx = 0; bx < (split ? NL : 1); bx++) {
            TfCta cta(NW * 32, bx, by);
            std::memset(sm.data(), 0xCD, sm.size());
            std::vector<std::thread> th;
            for (int t = 0; t < NW * 32; t++)
                th.emplace_back([&, t] {
                    tf_cta = &cta; tf_tid_v = t;
                    attn_q_body((const float*)q.data(), kc.data(), vc.data(), (const float*)kcb.data(),
                                (const float*)vcb.data(), o.data(), m.data(), l.data(), acc.data(),
                                (const int*)st.data(), Hkv, GRP, NCH, split ? NL : 1, CHUNK, MINR,
                                qk_scale, split, sm.data());
                });
            for (auto& x : th) x.join();
        }
    wr(dir + "/o.bin", o.data(), o.size() * 4);
    wr(dir + "/m.bin", m.data(), m.size() * 4);
    wr(dir + "/l.bin", l.data(), l.size() * 4);
    wr(dir + "/acc.bin", acc.data(), acc.size() * 4);
    return 0;
}
