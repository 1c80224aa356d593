// GCC 12 reports the deliberately undefined upper halves inside its own
// AVX-512 cast/extract intrinsics as uninitialized. A kernel file that uses
// them includes this before brisk's other headers (cpu_util.h and hsum16.h
// hold intrinsics too); the pragmas hold for the rest of that file.
#pragma once

#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a GCC-only warning; clang would warn about the unknown group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
