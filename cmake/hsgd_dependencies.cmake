# All third-party dependencies come from Debian packages (third_party/packages.txt).
# The same calls are repeated in hsgdConfig.cmake.in for applications outside the tree.
find_package(Threads REQUIRED)
find_package(Gloo REQUIRED)            # target: gloo (TCP transport built in, no libuv)
find_package(Protobuf REQUIRED)        # FindProtobuf module; use protobuf_generate(TARGET ...)
find_package(Boost 1.74 REQUIRED COMPONENTS system)
find_package(spdlog REQUIRED)
find_package(OpenSSL 3 REQUIRED)       # TLS 1.3 with pre-shared keys (comm/tls)
find_package(ZLIB REQUIRED)
find_package(CLI11 REQUIRED)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
