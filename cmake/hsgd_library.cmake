# hsgd_add_library(NAME SOURCES src... DEPS dep...)
# Builds one static library of a layer from the listed sources (paths relative to the calling
# folder). Sources are listed, not globbed, so a stray file is never compiled by accident.
# Includes are written from the repository root; generated headers live in the build root.
function(hsgd_add_library name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;DEPS")
  add_library(${name} STATIC ${arg_SOURCES} ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>)
  target_link_libraries(${name} PUBLIC ${arg_DEPS})
endfunction()
