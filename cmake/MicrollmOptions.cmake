# Compiler flags shared by every microLLM target: microllm_set_target_options(<target>).

function(microllm_set_target_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wno-unknown-pragmas>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${MICROLLM_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>)
  if(MICROLLM_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# A library of one layer: microllm_<layer>, exported as microLLM::<layer>.
function(microllm_add_layer layer)
  # C_ABI: a layer whose public headers are C; its C++ requirements stay private so C projects can link it.
  cmake_parse_arguments(ARG "C_ABI" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(target microllm_${layer})
  add_library(${target} ${ARG_SOURCES})
  add_library(microLLM::${layer} ALIAS ${target})
  set_target_properties(${target} PROPERTIES
    EXPORT_NAME ${layer}
    OUTPUT_NAME microllm_${layer}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR})
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  if(ARG_C_ABI)
    target_compile_features(${target} PRIVATE cxx_std_20)
  else()
    target_compile_features(${target} PUBLIC cxx_std_20)
  endif()
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  microllm_set_target_options(${target})
  set_property(GLOBAL APPEND PROPERTY MICROLLM_LAYERS ${target})
endfunction()
