# cmake -DBUILD_DIR=... -DCONSUMERS_DIR=... -DWORK_DIR=... -DGENERATOR=... -P run_consumers.cmake

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${ARGN}\n${out}${err}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "command failed (${result}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(stage ${WORK_DIR}/stage)
set(prefix ${WORK_DIR}/relocated-prefix)

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${stage})
file(RENAME ${stage} ${prefix})  # nothing may remember the install location

file(GLOB consumers LIST_DIRECTORIES true ${CONSUMERS_DIR}/*)
foreach(consumer IN LISTS consumers)
  if(NOT EXISTS ${consumer}/CMakeLists.txt)
    continue()
  endif()
  get_filename_component(name ${consumer} NAME)
  set(build ${WORK_DIR}/build-${name})
  run(${CMAKE_COMMAND} -S ${consumer} -B ${build} -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
      -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build ${build})
  file(GLOB programs ${build}/*_consumer)
  list(LENGTH programs count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "expected one *_consumer program in ${build}, found: ${programs}")
  endif()
  run(${programs})
endforeach()

# pkg-config: the same C program, compiled by hand from the .pc file.
find_program(PKG_CONFIG pkg-config)
find_program(CC NAMES cc gcc)
if(PKG_CONFIG AND CC)
  file(GLOB_RECURSE pc_files ${prefix}/*/microllm.pc)
  list(GET pc_files 0 pc_file)
  get_filename_component(pc_dir ${pc_file} DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} ${pc_dir})
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs microllm OUTPUT_VARIABLE flags RESULT_VARIABLE result
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "pkg-config could not read ${pc_file}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(${CC} ${CONSUMERS_DIR}/c-api/main.c -o ${WORK_DIR}/c_consumer_pkgconfig ${flags} -lm)
  run(${WORK_DIR}/c_consumer_pkgconfig)
else()
  message(FATAL_ERROR "pkg-config and a C compiler are needed for the package test")
endif()
# The Python package, where the build made one: imported from the relocated prefix's site-packages.
file(GLOB_RECURSE python_extensions ${prefix}/*/microllm/_microllm*.so)
if(python_extensions AND PYTHON)
  list(GET python_extensions 0 extension)
  get_filename_component(package_dir ${extension} DIRECTORY)
  get_filename_component(site_dir ${package_dir} DIRECTORY)
  set(ENV{PYTHONPATH} ${site_dir})
  run(${PYTHON} -c "import numpy, microllm; a = numpy.arange(6, dtype=numpy.float32).reshape(2, 3); \
t = microllm.from_numpy(a); assert numpy.asarray(microllm.ops.matmul(t, t, transpose_b=True)).tolist() == \
(a @ a.T).tolist(); assert microllm.__file__.startswith('${prefix}'), microllm.__file__; print('python ok', microllm.__file__)")
endif()
message(STATUS "every consumer built and ran against the relocated SDK")
