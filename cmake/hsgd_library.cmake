# hsgd_add_folder_library(NAME DIR DEPS...)
# Builds one static library from every .cpp under DIR (recursively), so adding a source file
# needs no CMake edit. Includes are written from the repository root.
function(hsgd_add_folder_library name dir)
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${dir}/*.cpp)
  add_library(${name} STATIC ${sources} ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>)
  target_link_libraries(${name} PUBLIC ${ARGN})
endfunction()
