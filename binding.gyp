{
  "target_defaults": {
    "cflags": ["-O3", "-fPIC", "-Wall", "-Wno-unused-function"],
    "cflags_c": ["-std=gnu11"],
    "cflags_cc": ["-std=c++17"],
    "include_dirs": ["native/src"]
  },
  "targets": [
    {
      "target_name": "prima",
      "sources": [
        "native/addon.cc",
        "native/bind_kernels.cc",
        "native/bind_model.cc",
        "native/bind_lane.cc",
        "native/bind_profile.cc",
        "native/bind_io.cc",
        "native/src/kernels.c",
        "native/src/quants.c",
        "native/src/threadpool.c",
        "native/src/matmul.c",
        "native/src/ops.c",
        "native/src/kv_cache.c",
        "native/src/attn_tile.c",
        "native/src/model.c",
        "native/src/expert_prefetch.c",
        "native/src/advisor.c",
        "native/src/kv_shift.c",
        "native/src/ws_codec.c",
        "native/src/sparse_attn.c",
        "native/src/lane.c",
        "native/src/seal.c",
        "native/src/profile.c"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS"],
      "libraries": ["-lpthread", "-lm"],
      "conditions": [
        ["target_arch=='x64'", { "dependencies": ["prima_avx2", "prima_avx512", "prima_avx512vnni"] }],
        ["target_arch=='arm64'", { "sources": ["native/src/quants_neon.c"], "defines": ["PRIMA_HAVE_NEON"] }]
      ]
    },
    {
      "target_name": "prima_avx2",
      "type": "static_library",
      "conditions": [
        ["target_arch=='x64'", { "sources": ["native/src/quants_x86.c"], "cflags": ["-mavx2", "-mfma", "-mf16c"] }]
      ]
    },
    {
      "target_name": "prima_avx512",
      "type": "static_library",
      "conditions": [
        ["target_arch=='x64'", {
          "sources": ["native/src/quants_x86.c"],
          "cflags": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"]
        }]
      ]
    },
    {
      "target_name": "prima_avx512vnni",
      "type": "static_library",
      "conditions": [
        ["target_arch=='x64'", {
          "sources": ["native/src/quants_x86.c"],
          "cflags": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512vnni"]
        }]
      ]
    }
  ]
}
