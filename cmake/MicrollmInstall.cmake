# `cmake --install`: libraries, headers, a relocatable CMake package (microLLMConfig.cmake, version file,
# exported targets microLLM::microLLM and microLLM::<layer>) and a pkg-config file.
include(CMakePackageConfigHelpers)

set(MICROLLM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/microLLM)
get_property(microllm_layers GLOBAL PROPERTY MICROLLM_LAYERS)

install(TARGETS ${microllm_layers} microllm EXPORT microLLMTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/microllm DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT microLLMTargets NAMESPACE microLLM:: DESTINATION ${MICROLLM_CMAKE_DIR})

set(MICROLLM_COMPONENTS "")
foreach(target IN LISTS microllm_layers)
  string(REPLACE "microllm_" "" layer ${target})
  list(APPEND MICROLLM_COMPONENTS ${layer})
endforeach()
if(BUILD_SHARED_LIBS)
  set(MICROLLM_STATIC OFF)
else()
  set(MICROLLM_STATIC ON)
endif()

configure_package_config_file(cmake/microLLMConfig.cmake.in ${PROJECT_BINARY_DIR}/microLLMConfig.cmake
  INSTALL_DESTINATION ${MICROLLM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/microLLMConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/microLLMConfig.cmake ${PROJECT_BINARY_DIR}/microLLMConfigVersion.cmake
  DESTINATION ${MICROLLM_CMAKE_DIR})

# pkg-config: prefix is found relative to the .pc file, so the installed tree can move.
set(MICROLLM_PC_LIBS "")
foreach(layer IN ITEMS capi serve train distributed generate models tokenizer io nn autograd ops backend profile core)
  if(TARGET microllm_${layer})
    string(APPEND MICROLLM_PC_LIBS " -lmicrollm_${layer}")
  endif()
endforeach()
file(RELATIVE_PATH MICROLLM_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
configure_file(cmake/microllm.pc.in ${PROJECT_BINARY_DIR}/microllm.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/microllm.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
