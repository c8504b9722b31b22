// The microLLM version. CMakeLists.txt checks at configure time that these match project(VERSION).
#pragma once

#define MICROLLM_VERSION_MAJOR 0
#define MICROLLM_VERSION_MINOR 1
#define MICROLLM_VERSION_PATCH 0
#define MICROLLM_VERSION_STRING "0.1.0"
