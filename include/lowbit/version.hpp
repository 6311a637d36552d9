// lowbit's version. The one place it is written: CMakeLists.txt reads it from here, so
// that the headers work with no build system (-I include) and the package agrees.
#pragma once

/// lowbit's version, as numbers and as a string.
#define LOWBIT_VERSION_MAJOR 0
#define LOWBIT_VERSION_MINOR 1
#define LOWBIT_VERSION_PATCH 0
#define LOWBIT_VERSION_STRING "0.1.0"
