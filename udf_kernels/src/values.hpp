// Whole-array kernels behind tensor_map, tensor_cast and tensor_slice_strided, callable from other kernels
// (tensor_program runs them on the values of a program without a DuckDB call each).
#pragma once

#include "dtype.hpp"
#include "ops.hpp"

namespace tsk {

class ThreadBudget;

// out = map f of the n values of dt at in (tensor_map's checks of f's flags and param included).
void map_values(ThreadBudget *budget, DType dt, Fn f, const unsigned char *in, unsigned char *out, uint64_t n,
                bool has_param, double param, const char *fn);

// out = the n values at in (dtype from) converted to dtype to, as numpy's astype (tensor_cast).
void cast_values(DType from, DType to, const unsigned char *in, unsigned char *out, uint64_t n);

// The bytes of x[start::step] (count elements per dimension) of an x of shape xs, after checking that every
// element read lies inside x (tensor_slice_strided's checks); fails naming fn.
uint64_t slice_bytes(DType dt, const Shape &xs, const Shape &start, const Shape &count, const Shape &step,
                     const char *fn);
// z = that slice of x (checked first with slice_bytes).
void slice_values(DType dt, const Shape &xs, const Shape &start, const Shape &count, const Shape &step,
                  const unsigned char *x, unsigned char *z);

} // namespace tsk
