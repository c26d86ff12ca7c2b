"""Shared einsum test cases for tensorsql.

Every case is tiny (at most ~500 elements per operand) so the whole list can be run through DuckDB for
several dtypes and blockings in CI.  This module only needs numpy; ``tests/planner/test_equations_valid.py``
checks that numpy accepts every case.

``EQUATIONS``     -- string-form cases ``Case(id, subscripts, shapes, category)``.
``SUBLIST_CASES`` -- interleaved/sublist-form cases ``SublistCase(id, shapes, sublists, output)``.
``BLOCKING_CASES``-- ~40 cases with larger dims, used for the blocked ``from_numpy`` tests.
``NARY_OPTIMIZE_CASES`` -- n-ary cases used for the ``optimize=`` variations.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Case:
    id: str
    subscripts: str
    shapes: tuple[Shape, ...]
    category: str

    def __iter__(self):  # allow ``id, subscripts, shapes, category = case``
        return iter((self.id, self.subscripts, self.shapes, self.category))


@dataclass(frozen=True)
class SublistCase:
    """``np.einsum(op0, sublists[0], op1, sublists[1], ..., output)``; ``output`` None = implicit."""

    id: str
    shapes: tuple[Shape, ...]
    sublists: tuple[tuple, ...]
    output: tuple | None

    def args(self, operands) -> list:
        """The positional arguments of the interleaved call for the given operands."""
        out: list = []
        for op, sub in zip(operands, self.sublists, strict=True):
            out += [op, list(sub)]
        if self.output is not None:
            out.append(list(self.output))
        return out

    @property
    def max_label(self) -> int:
        labels = [x for sub in self.sublists for x in sub if x is not Ellipsis]
        return max(labels, default=-1)


EQUATIONS: list[Case] = []


def _add(category: str, id_: str, subscripts: str, *shapes: Shape) -> None:
    EQUATIONS.append(Case(f"{category}-{id_}", subscripts, tuple(tuple(s) for s in shapes), category))


# --------------------------------------------------------------------------------------------------
# binary contractions
# --------------------------------------------------------------------------------------------------
_b = "binary"
_add(_b, "matmul", "ij,jk->ik", (3, 4), (4, 5))
_add(_b, "matmul_square", "ij,jk->ik", (4, 4), (4, 4))
_add(_b, "matvec", "ij,j->i", (4, 5), (5,))
_add(_b, "vecmat", "i,ij->j", (4,), (4, 5))
_add(_b, "inner", "i,i->", (6,), (6,))
_add(_b, "outer", "i,j->ij", (3,), (4,))
_add(_b, "outer_transposed_out", "i,j->ji", (3,), (4,))
_add(_b, "outer_3d", "ij,k->ijk", (2, 3), (4,))
_add(_b, "outer_4d", "ij,kl->ikjl", (2, 3), (3, 2))
_add(_b, "matmul_At", "ji,jk->ik", (4, 3), (4, 5))
_add(_b, "matmul_Bt", "ij,kj->ik", (3, 4), (5, 4))
_add(_b, "matmul_AtBt", "ji,kj->ik", (4, 3), (5, 4))
_add(_b, "matmul_out_t", "ij,jk->ki", (3, 4), (4, 5))
_add(_b, "matmul_swapped_operands", "jk,ij->ik", (4, 5), (3, 4))
_add(_b, "bmm", "bij,bjk->bik", (2, 3, 4), (2, 4, 5))
_add(_b, "bmm_batch_last", "ijb,jkb->ikb", (3, 4, 2), (4, 5, 2))
_add(_b, "bmm_out_perm", "bij,bjk->kbi", (2, 3, 4), (2, 4, 5))
_add(_b, "bmm_batch_unbatched", "ij,bjk->bik", (3, 4), (2, 4, 5))
_add(_b, "batched_matvec", "bij,bj->bi", (3, 4, 5), (3, 5))
_add(_b, "batched_outer", "bi,bj->bij", (3, 4), (3, 5))
_add(_b, "batched_inner", "bi,bi->b", (4, 5), (4, 5))
_add(_b, "frobenius", "ij,ij->", (3, 4), (3, 4))
_add(_b, "hadamard", "ij,ij->ij", (3, 4), (3, 4))
_add(_b, "hadamard_transposed", "ij,ji->ij", (3, 4), (4, 3))
_add(_b, "rowwise_dot", "ij,ij->i", (3, 4), (3, 4))
_add(_b, "trace_of_product", "ab,ba->", (3, 4), (4, 3))
_add(_b, "diag_of_product", "ab,ba->a", (3, 4), (4, 3))
_add(_b, "tensordot_2labels", "ijk,jkl->il", (2, 3, 4), (3, 4, 5))
_add(_b, "tensordot_3labels", "ijkl,jkl->i", (2, 3, 4, 5), (3, 4, 5))
_add(_b, "tensordot_3labels_perm", "abcd,dcb->a", (2, 3, 4, 5), (5, 4, 3))
_add(_b, "tensordot_all", "ijk,ijk->", (2, 3, 4), (2, 3, 4))
_add(_b, "tensordot_all_perm", "ijk,kji->", (2, 3, 4), (4, 3, 2))
_add(_b, "contract_middle", "iaj,kal->ijkl", (2, 3, 2), (2, 3, 2))
_add(_b, "contract_mixed_order", "abc,cd->dab", (2, 3, 4), (4, 5))
_add(_b, "sum_one_side", "ij,k->i", (3, 4), (5,))
_add(_b, "sum_both_unrelated", "ij,kl->", (3, 4), (2, 5))
_add(_b, "attention_scores", "bhqd,bhkd->bhqk", (2, 2, 3, 4), (2, 2, 5, 4))
_add(_b, "attention_apply", "bhqk,bhkd->bhqd", (2, 2, 3, 5), (2, 2, 5, 4))
_add(_b, "bilinear_partial", "abc,bd->acd", (3, 4, 2), (4, 3))
_add(_b, "size1_dims", "ij,jk->ik", (1, 1), (1, 1))

# --------------------------------------------------------------------------------------------------
# unary: transpose, sums, traces, diagonals, identity
# --------------------------------------------------------------------------------------------------
_u = "unary"
_add(_u, "identity", "ij->ij", (3, 4))
_add(_u, "identity_vector", "i->i", (5,))
_add(_u, "identity_3d", "ijk->ijk", (2, 3, 4))
_add(_u, "transpose", "ij->ji", (3, 4))
_add(_u, "permute3", "ijk->kij", (2, 3, 4))
_add(_u, "permute4", "abcd->dbca", (2, 3, 4, 5))
_add(_u, "sum_vector", "i->", (6,))
_add(_u, "sum_all", "ij->", (3, 4))
_add(_u, "sum_axis0", "ij->j", (3, 4))
_add(_u, "sum_axis1", "ij->i", (3, 4))
_add(_u, "sum_middle", "ijk->ik", (2, 3, 4))
_add(_u, "sum_two_axes", "ijk->j", (2, 3, 4))
_add(_u, "sum_and_transpose", "ijk->ki", (2, 3, 4))
_add(_u, "sum_all_4d", "abcd->", (2, 3, 2, 3))
_add(_u, "trace", "ii->", (4, 4))
_add(_u, "diagonal", "ii->i", (4, 4))
_add(_u, "iij", "iij->j", (3, 3, 4))
_add(_u, "iij_keep", "iij->ij", (3, 3, 4))
_add(_u, "iij_to_ji", "iij->ji", (3, 3, 4))
_add(_u, "iji", "iji->j", (3, 4, 3))
_add(_u, "jii", "jii->ji", (4, 3, 3))
_add(_u, "iii_diag", "iii->i", (3, 3, 3))
_add(_u, "iii_trace", "iii->", (3, 3, 3))
_add(_u, "iijj", "iijj->ij", (2, 2, 3, 3))
_add(_u, "iijj_t", "iijj->ji", (2, 2, 3, 3))
_add(_u, "iijj_all", "iijj->", (2, 2, 3, 3))
_add(_u, "ijij", "ijij->ij", (2, 3, 2, 3))
_add(_u, "ijji_trace", "ijji->", (2, 3, 3, 2))
_add(_u, "diag_1x1", "ii->i", (1, 1))
_add(_u, "size1_transpose", "ijk->kji", (1, 4, 1))

# --------------------------------------------------------------------------------------------------
# implicit output (no '->'): labels appearing exactly once, sorted (uppercase before lowercase)
# --------------------------------------------------------------------------------------------------
_i = "implicit"
_add(_i, "matmul", "ij,jk", (3, 4), (4, 5))
_add(_i, "matmul_At", "ji,jk", (4, 3), (4, 5))
_add(_i, "inner", "i,i", (5,), (5,))
_add(_i, "outer", "i,j", (3,), (4,))
_add(_i, "outer_reversed", "j,i", (3,), (4,))
_add(_i, "transpose", "ba", (3, 4))
_add(_i, "reverse3", "zyx", (2, 3, 4))
_add(_i, "identity", "ij", (3, 4))
_add(_i, "vector", "i", (5,))
_add(_i, "trace", "ii", (4, 4))
_add(_i, "iij", "iij", (3, 3, 4))
_add(_i, "bmm_sums_batch", "bij,bjk", (2, 3, 4), (2, 4, 5))
_add(_i, "chain3", "ij,jk,kl", (2, 3), (3, 4), (4, 5))
_add(_i, "ring3_scalar", "ab,bc,ca", (2, 3), (3, 4), (4, 2))
_add(_i, "hadamard_sum", "ij,ij", (3, 4), (3, 4))
_add(_i, "uppercase_first", "aB", (3, 4))

# --------------------------------------------------------------------------------------------------
# ellipsis broadcasting
# --------------------------------------------------------------------------------------------------
_e = "ellipsis"
_add(_e, "transpose_last2", "...ij->...ji", (2, 3, 4))
_add(_e, "bmm", "...ij,...jk->...ik", (2, 3, 4), (2, 4, 5))
_add(_e, "bmm_implicit", "...ij,...jk", (2, 3, 4), (2, 4, 5))
_add(_e, "bmm_broadcast_size1", "...ij,...jk->...ik", (2, 1, 3, 4), (5, 4, 2))
_add(_e, "bmm_rank_mismatch", "...ij,...jk->...ik", (3, 2, 3, 4), (4, 2))
_add(_e, "only_first_operand", "...ij,jk->...ik", (2, 3, 4), (4, 5))
_add(_e, "only_second_operand", "ij,...jk->...ik", (3, 4), (2, 4, 5))
_add(_e, "trailing", "ij...,jk...->ik...", (3, 4, 2), (4, 5, 2))
_add(_e, "middle", "i...j,j...k->i...k", (3, 2, 4), (4, 2, 5))
_add(_e, "empty", "...ij,...jk->...ik", (3, 4), (4, 5))
_add(_e, "sum_trailing_two", "...ij->...", (2, 3, 4))
_add(_e, "sum_last", "...i->...", (2, 3, 4))
_add(_e, "sum_first", "i...->...", (2, 3, 4))
_add(_e, "identity", "...->...", (2, 3))
_add(_e, "identity_implicit", "...", (2, 3))
_add(_e, "elementwise_broadcast", "...,...->...", (2, 3), (3,))
_add(_e, "elementwise_outer_broadcast", "...,...", (3, 1), (1, 4))
_add(_e, "diagonal", "...ii->...i", (2, 3, 3))
_add(_e, "trace", "...ii->...", (2, 3, 3))
_add(_e, "diag_leading", "ii...->i...", (3, 3, 2))
_add(_e, "out_ellipsis_middle", "ab...,b...->a...", (2, 3, 4), (3, 4))
_add(_e, "out_label_after", "a...,a...->...a", (3, 2, 2), (3, 1, 2))
_add(_e, "matvec_ranks", "...ij,...j->...i", (2, 2, 3, 4), (4,))
_add(_e, "zero_d_operand", "...,i->...i", (), (3,))
_add(_e, "sum_broadcast_label", "...a,...a->...", (2, 1, 3), (4, 3))
_add(_e, "both_ways_broadcast", "...i,...i->...i", (3, 1, 2), (1, 4, 2))
_add(_e, "uppercase", "...A,A...->...", (2, 3), (3, 2))
_add(_e, "three_operands", "...i,...i,...->...i", (2, 3), (1, 3), (2,))
_add(_e, "chain3", "...ij,...jk,...kl->...il", (2, 2, 3), (1, 3, 4), (4, 2))

# --------------------------------------------------------------------------------------------------
# size-1 broadcasting between operands on the same label
# --------------------------------------------------------------------------------------------------
_s = "broadcast1"
_add(_s, "hadamard_col", "ij,ij->ij", (3, 1), (3, 4))
_add(_s, "hadamard_row_col", "ij,ij->ij", (1, 4), (3, 1))
_add(_s, "contracted_label", "ij,jk->ik", (3, 1), (4, 5))
_add(_s, "inner_len1", "i,i->", (1,), (5,))
_add(_s, "elementwise_len1", "i,i->i", (5,), (1,))
_add(_s, "bmm_batch1", "bij,bjk->bik", (1, 3, 4), (2, 4, 5))
_add(_s, "three_way", "ij,ij,ij->ij", (3, 1), (1, 4), (3, 4))
_add(_s, "mixed", "ijk,ik->ijk", (2, 3, 4), (2, 1))

# --------------------------------------------------------------------------------------------------
# repeated labels inside one operand, combined with other operands
# --------------------------------------------------------------------------------------------------
_r = "repeated"
_add(_r, "diag_times_vec", "ii,i->i", (3, 3), (3,))
_add(_r, "diag_dot_vec", "ii,i->", (3, 3), (3,))
_add(_r, "diag_outer", "ii,jj->ij", (3, 3), (4, 4))
_add(_r, "trace_product", "ii,jj->", (3, 3), (4, 4))
_add(_r, "iij_jk", "iij,jk->ik", (2, 2, 3), (3, 4))
_add(_r, "ij_jj", "ij,jj->ij", (3, 4), (4, 4))
_add(_r, "ii_ij", "ii,ij->j", (3, 3), (3, 4))
_add(_r, "iij_ij", "iij,ij->ij", (3, 3, 4), (3, 4))
_add(_r, "ijj_jk", "ijj,jk->ik", (2, 3, 3), (3, 4))
_add(_r, "ii_ii", "ii,ii->i", (4, 4), (4, 4))
_add(_r, "aab_bcc", "aab,bcc->ac", (2, 2, 3), (3, 4, 4))
_add(_r, "ii_i_i", "ii,i,i->", (3, 3), (3,), (3,))
_add(_r, "diag_output_kept_with_other", "iij,k->ijk", (2, 2, 3), (2,))

# --------------------------------------------------------------------------------------------------
# labels shared by three or more operands (hyperedges)
# --------------------------------------------------------------------------------------------------
_h = "shared3"
_add(_h, "hadamard3", "ij,ij,ij->ij", (3, 4), (3, 4), (3, 4))
_add(_h, "triple_inner", "i,i,i->", (5,), (5,), (5,))
_add(_h, "triple_elementwise", "i,i,i->i", (5,), (5,), (5,))
_add(_h, "quad_inner", "i,i,i,i->i", (4,), (4,), (4,), (4,))
_add(_h, "hub_open", "ij,jk,jl->ikl", (2, 3), (3, 2), (3, 4))
_add(_h, "hub_kept", "ij,jk,jl->jkl", (2, 3), (3, 2), (3, 4))
_add(_h, "batched_triple_outer", "bi,bj,bk->bijk", (2, 3), (2, 2), (2, 4))
_add(_h, "four_frobenius", "ab,ab,ab,ab->", (2, 3), (2, 3), (2, 3), (2, 3))
_add(_h, "fan_out", "ij,ik,il->jkl", (3, 2), (3, 4), (3, 2))
_add(_h, "triangle_hyper", "ijk,ij,ik,jk->", (2, 3, 4), (2, 3), (2, 4), (3, 4))
_add(_h, "abc3", "abc,abc,abc->c", (2, 3, 4), (2, 3, 4), (2, 3, 4))

# --------------------------------------------------------------------------------------------------
# 0-d operands
# --------------------------------------------------------------------------------------------------
_z = "scalar0d"
_add(_z, "scalar_product", ",->", (), ())
_add(_z, "scalar_product_implicit", ",", (), ())
_add(_z, "scalar_identity", "->", ())
_add(_z, "vector_times_scalar", "i,->i", (4,), ())
_add(_z, "scalar_times_vector", ",i->i", (), (4,))
_add(_z, "scalar_times_matrix_t", ",ij->ji", (), (3, 4))
_add(_z, "three_scalars", ",,->", (), (), ())
_add(_z, "sum_times_scalar", "ij,->", (3, 4), ())
_add(_z, "scalar_inner", ",i,i->", (), (4,), (4,))
_add(_z, "scalar_implicit_vector", "i,", (4,), ())

# --------------------------------------------------------------------------------------------------
# zero-size dimensions
# --------------------------------------------------------------------------------------------------
_0 = "zerosize"
_add(_0, "matmul_rows0", "ij,jk->ik", (0, 3), (3, 4))
_add(_0, "matmul_contract0", "ij,jk->ik", (3, 0), (0, 4))
_add(_0, "matmul_cols0", "ij,jk->ik", (3, 4), (4, 0))
_add(_0, "sum_empty", "i->", (0,))
_add(_0, "inner_empty", "i,i->", (0,), (0,))
_add(_0, "diag_empty", "ii->i", (0, 0))
_add(_0, "trace_empty", "ii->", (0, 0))
_add(_0, "transpose_empty", "ij->ji", (0, 3))
_add(_0, "ellipsis_empty_batch", "...ij,...jk->...ik", (0, 2, 3), (0, 3, 2))
_add(_0, "broadcast_with_empty", "ij,ij->ij", (0, 3), (1, 3))
_add(_0, "outer_empty", "i,j->ij", (0,), (3,))
_add(_0, "bmm_empty_rows", "bij,bjk->bik", (2, 0, 3), (2, 3, 4))
_add(_0, "sum_all_empty", "ijk->", (2, 0, 3))
_add(_0, "chain_empty_middle", "ij,jk,kl->il", (2, 3), (3, 0), (0, 4))

# --------------------------------------------------------------------------------------------------
# uppercase labels
# --------------------------------------------------------------------------------------------------
_U = "uppercase"
_add(_U, "matmul_mixed_case", "Ab,bC->AC", (3, 4), (4, 5))
_add(_U, "reverse", "ABC->CBA", (2, 3, 4))
_add(_U, "case_distinct_trace", "aA,Aa->", (3, 4), (4, 3))
_add(_U, "chain", "Aa,aB,Bb->Ab", (2, 3), (3, 4), (4, 2))
_add(_U, "implicit_upper", "IJ,JK", (3, 4), (4, 5))
_add(_U, "pairs", "zZ,Zz->zZ", (3, 4), (4, 3))
_add(_U, "diag_upper", "II->I", (3, 3))
_add(_U, "many_labels", "ABCDEF,FEDcba->ABCabc", (1, 2, 1, 2, 2, 2), (2, 2, 2, 2, 1, 2))

# --------------------------------------------------------------------------------------------------
# n-ary: chains, tensor trains / MPS, trees, grids, stars (3..8 operands)
# --------------------------------------------------------------------------------------------------
_n = "nary"
_add(_n, "chain3", "ij,jk,kl->il", (2, 3), (3, 4), (4, 5))
_add(_n, "chain3_out_t", "ij,jk,kl->li", (2, 3), (3, 4), (4, 5))
_add(_n, "chain4", "ab,bc,cd,de->ae", (5, 2), (2, 6), (6, 3), (3, 4))
_add(_n, "chain5", "ab,bc,cd,de,ef->af", (2, 3), (3, 4), (4, 2), (2, 5), (5, 3))
_add(_n, "chain6", "ab,bc,cd,de,ef,fg->ag", (3, 2), (2, 4), (4, 3), (3, 2), (2, 5), (5, 2))
_add(_n, "chain7", "ij,jk,kl,lm,mn,no,op->ip", (2, 3), (3, 2), (2, 4), (4, 2), (2, 3), (3, 2), (2, 2))
_add(_n, "chain8", "ab,bc,cd,de,ef,fg,gh,hi->ai", *[(2, 3), (3, 2)] * 4)
_add(_n, "chain3_cyclic_trace", "ij,jk,ki->", (2, 3), (3, 4), (4, 2))
_add(_n, "chain4_cyclic_trace", "ab,bc,cd,da->", (2, 3), (3, 4), (4, 5), (5, 2))
_add(_n, "vec_mat_vec", "i,ij,j->", (3,), (3, 4), (4,))
_add(_n, "vec_mat_mat_vec", "i,ij,jk,k->", (3,), (3, 4), (4, 5), (5,))
_add(_n, "batched_chain", "bij,bjk,bkl->bil", (2, 3, 4), (2, 4, 2), (2, 2, 3))
_add(_n, "batched_bilinear", "bi,ij,bj->b", (3, 4), (4, 5), (3, 5))
_add(_n, "triangle", "ij,jk,ik->", (2, 3), (3, 4), (2, 4))
_add(_n, "triangle_open", "ij,jk,ik->i", (2, 3), (3, 4), (2, 4))
_add(_n, "ring5", "ab,bc,cd,de,ea->", (2, 3), (3, 2), (2, 4), (4, 3), (3, 2))
_add(_n, "tt_reconstruct3", "ai,ibj,jc->abc", (2, 3), (3, 2, 3), (3, 2))
_add(_n, "tt_reconstruct4", "ai,ibj,jck,kd->abcd", (2, 3), (3, 2, 2), (2, 3, 3), (3, 2))
_add(_n, "tt_dot_vectors", "ai,ibj,jc,a,b,c->", (2, 3), (3, 4, 2), (2, 3), (2,), (4,), (3,))
_add(_n, "mps_periodic", "iab,jbc,kca->ijk", (2, 3, 4), (2, 4, 2), (2, 2, 3))
_add(_n, "mps_norm3", "pa,qab,rb,pc,qcd,rd->", (2, 3), (2, 3, 3), (2, 3), (2, 3), (2, 3, 3), (2, 3))
_add(_n, "mpo_apply", "pa,qab,rb,spa,tqab,urb->stu",
     (2, 2), (2, 2, 2), (2, 2), (2, 2, 2), (2, 2, 2, 2), (2, 2, 2))
_add(_n, "tree_3level", "abc,ade,bfg,ch->defgh", (2, 3, 2), (2, 2, 3), (3, 2, 2), (2, 4))
_add(_n, "tree_binary_leaves", "ab,acd,bef,c,d,e,f->", (3, 2), (3, 2, 2), (2, 3, 2), (2,), (2,), (3,), (2,))
_add(_n, "peps_2x2_open", "pac,qad,rbc,sbd->pqrs", (2, 2, 3), (2, 2, 2), (2, 3, 3), (2, 3, 2))
_add(_n, "peps_2x3_scalar", "ad,abe,bf,cd,cgh,fg->",
     (2, 3), (2, 2, 3), (2, 2), (3, 3), (3, 2, 2), (2, 2))
_add(_n, "grid_2x4", "ai,abj,bck,cl,di,dej,efk,fl->",
     (2, 2), (2, 3, 2), (3, 2, 2), (2, 2), (3, 2), (3, 2, 2), (2, 3, 2), (3, 2))
_add(_n, "star_open", "ai,bi,ci,di->abcd", (2, 3), (3, 3), (2, 3), (3, 3))
_add(_n, "star_center", "abcd,a,b,c,d->", (2, 3, 2, 3), (2,), (3,), (2,), (3,))
_add(_n, "star_hub_kept", "ia,ib,ic,id,ie->i", (3, 2), (3, 3), (3, 2), (3, 2), (3, 3))
_add(_n, "tucker", "abc,ia,jb,kc->ijk", (2, 3, 2), (4, 2), (3, 3), (2, 2))
_add(_n, "cp_reconstruct", "ir,jr,kr->ijk", (3, 2), (4, 2), (2, 2))
_add(_n, "mttkrp", "ijk,jr,kr->ir", (3, 4, 2), (4, 3), (2, 3))
_add(_n, "mixed_hyper_chain", "ab,bc,cd,bd->a", (2, 3), (3, 4), (4, 2), (3, 2))

# --------------------------------------------------------------------------------------------------
# n-ary cases in the style of the einsum_benchmark instances (ti2-group/einsum_benchmark):
# quantum-circuit networks, MPS products, random regular graphs, random (hyper)networks with global
# dimensions and self edges, lattices, trees, shuffled matrix chains, QAOA max-cut, model counting,
# language-model-like batched networks.  Own small instances written in that style.
# --------------------------------------------------------------------------------------------------
_k = "benchmark"


def _mps_product(n: int, phys: int, bond: int) -> tuple[str, list[Shape]]:
    """<psi|phi> for two n-site MPS (same layout as the benchmark's mps_product generator)."""
    sym = string.ascii_letters
    terms = ["ab", "ac"]
    shapes: list[Shape] = [(phys, bond), (phys, bond)]
    for i in range(1, n - 1):
        j = 3 * i
        ul, ur, m, ll, lr = (sym[x] for x in (j - 1, j + 2, j, j - 2, j + 1))
        terms += [m + ul + ur, m + ll + lr]
        shapes += [(phys, bond, bond), (phys, bond, bond)]
    j = 3 * (n - 1)
    ul, m, ll = (sym[x] for x in (j - 1, j, j - 2))
    terms += [m + ul, m + ll]
    shapes += [(phys, bond), (phys, bond)]
    return ",".join(terms) + "->", shapes


_eq, _shp = _mps_product(3, 2, 3)
_add(_k, "mps_product_n3", _eq, *_shp)
_eq, _shp = _mps_product(4, 2, 2)
_add(_k, "mps_product_n4", _eq, *_shp)
# 3-qubit circuit amplitude <000|C|000>: kets, H gates, CNOT-like 4-index gates, bras
_add(_k, "qc_amplitude_3q", "a,b,c,ad,be,cf,degh,hfij,gk,il,jm,k,l,m->",
     (2,), (2,), (2,), (2, 2), (2, 2), (2, 2), (2, 2, 2, 2), (2, 2, 2, 2), (2, 2), (2, 2), (2, 2),
     (2,), (2,), (2,))
# 3-qubit circuit state vector (open output legs)
_add(_k, "qc_statevector_3q", "a,b,c,ad,bcef,degh,fi->ghi",
     (2,), (2,), (2,), (2, 2), (2, 2, 2, 2), (2, 2, 2, 2), (2, 2))
# 4-qubit circuit, simplified (gates absorbed), brickwork of 2-qubit gates, open legs
_add(_k, "qc_brickwork_4q", "abef,cdgh,fgij,eikl,jhmn->klmn",
     (2, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 2))
# random 3-regular graph on 6 nodes (prism graph): one tensor per node, one label per edge
# (edges a=01 b=12 c=20 d=34 e=45 f=53 g=03 h=14 i=25)
_add(_k, "randreg3_prism", "acg,abh,bci,dfg,deh,efi->",
     (2, 2, 2), (2, 3, 2), (3, 2, 3), (2, 2, 2), (2, 3, 2), (3, 2, 3))
# random connected network with open indices
_add(_k, "connected_network", "gafo,mab,hlbc,cdl,ve,fk,ogm,hv->dek",
     (2, 2, 3, 2), (2, 2, 2), (2, 2, 2, 3), (3, 2, 2), (3, 2), (3, 2), (2, 2, 2), (2, 3))
# hypernetwork with a global 'broadcast' dimension x on every operand
_add(_k, "hypernetwork_global_dim", "cabx,gxa,xbd,xdcg,ex->xe",
     (2, 2, 3, 2), (2, 2, 2), (2, 3, 2), (2, 2, 2, 2), (3, 2))
# hypernetwork with diagonals in hyperedges, self edges and single summation indices
_add(_k, "hypernetwork_diag_self_edges", "aab,ac,ad,bcee,fd->bc",
     (2, 2, 3), (2, 2), (2, 3), (3, 2, 2, 2), (2, 3))
# lattice 2x3 with varying bond sizes
_add(_k, "lattice_2x3", "ab,acd,ce,bf,dfg,eg->",
     (2, 3), (2, 2, 3), (2, 2), (3, 2), (3, 2, 4), (2, 4))
# random tree with 2 outer indices
_add(_k, "tree_n6", "ab,bcd,ce,dfg,f,g->ae",
     (3, 2), (2, 2, 3), (2, 4), (3, 2, 2), (2,), (2,))
# shuffled matrix chain
_add(_k, "matrix_chain_shuffled", "cd,ab,ef,de,bc->af", (4, 2), (3, 2), (2, 5), (2, 2), (2, 4))
# QAOA max-cut style: single-qubit vectors, ZZ phase matrices between wires (hyperedges), mixers
_add(_k, "qaoa_maxcut_triangle", "a,b,c,ab,bc,ca,ad,be,cf,de,ef,fd,d,e,f->",
     (2,), (2,), (2,), (2, 2), (2, 2), (2, 2), (2, 2), (2, 2), (2, 2), (2, 2), (2, 2), (2, 2),
     (2,), (2,), (2,))
# weighted model counting: clause tensors share variables (hyperedges), unit weights on variables
_add(_k, "model_counting_cnf", "abc,bcd,ade,ce,a,b,e->",
     (2, 2, 2), (2, 2, 2), (2, 2, 2), (2, 2), (2,), (2,), (2,))
# language-model-like: batch label b shared by every operand
_add(_k, "language_model_batched", "bsd,bde,bef,btf,bs->bt",
     (2, 3, 4), (2, 4, 3), (2, 3, 2), (2, 3, 2), (2, 3))


# --------------------------------------------------------------------------------------------------
# interleaved / sublist form
# --------------------------------------------------------------------------------------------------
def _long_chain_sublist(n_labels: int) -> SublistCase:
    """A chain of operands whose labels run 0..n_labels-1, each operand sharing one label with the next;
    operands have 2 or 3 labels of size 1 or 2 so that the whole thing stays tiny."""
    sublists: list[tuple] = []
    shapes: list[Shape] = []
    size = {lab: (2 if lab % 3 == 0 else 1) for lab in range(n_labels)}
    lab = 0
    while lab < n_labels - 1:
        width = 3 if (lab // 2) % 2 == 0 and lab + 2 < n_labels else 2
        labels = tuple(range(lab, lab + width))
        sublists.append(labels)
        shapes.append(tuple(size[x] for x in labels))
        lab += width - 1
    output = (0, n_labels - 1, 55, 40)
    return SublistCase(f"sublist-long_chain_{n_labels}_labels", tuple(shapes), tuple(sublists), output)


SUBLIST_CASES: list[SublistCase] = [
    SublistCase("sublist-matmul", ((3, 4), (4, 5)), ((0, 1), (1, 2)), (0, 2)),
    SublistCase("sublist-matmul_implicit", ((3, 4), (4, 5)), ((0, 1), (1, 2)), None),
    SublistCase("sublist-transpose", ((3, 4),), ((0, 1),), (1, 0)),
    SublistCase("sublist-trace", ((4, 4),), ((0, 0),), ()),
    SublistCase("sublist-diagonal", ((4, 4),), ((0, 0),), (0,)),
    SublistCase("sublist-inner", ((5,), (5,)), ((7,), (7,)), ()),
    SublistCase("sublist-outer", ((2,), (3,)), ((10,), (20,)), (20, 10)),
    SublistCase("sublist-scalar", ((), ()), ((), ()), ()),
    SublistCase("sublist-bmm_ellipsis", ((2, 3, 4), (2, 4, 5)), ((Ellipsis, 0, 1), (Ellipsis, 1, 2)),
                (Ellipsis, 0, 2)),
    SublistCase("sublist-ellipsis_implicit", ((2, 3, 4), (4,)), ((Ellipsis, 1), (1,)), None),
    SublistCase("sublist-chain4", ((2, 3), (3, 4), (4, 2), (2, 5)),
                ((0, 1), (1, 2), (2, 3), (3, 4)), (4, 0)),
    SublistCase("sublist-high_labels_below_52", ((2, 3), (3, 2)), ((50, 51), (51, 30)), (30, 50)),
    SublistCase("sublist-hyperedge", ((3, 2), (3, 4), (3,)), ((5, 6), (5, 7), (5,)), (5, 6, 7)),
    _long_chain_sublist(60),
    SublistCase("sublist-labels_above_52_small", ((2, 3), (3, 2), (2,)), ((60, 99), (99, 53), (53,)),
                (60,)),
]


def sublist_reference(case: SublistCase, operands) -> object:
    """numpy's result for a sublist case.  numpy only takes integer labels in [0, 52), so cases with
    larger labels are contracted operand by operand with ``np.einsum``, relabelling each pairwise step
    (those cases have no ellipsis and an explicit output)."""
    import numpy as np

    if case.max_label < 52:
        return np.einsum(*case.args(operands))
    assert case.output is not None and all(Ellipsis not in sub for sub in case.sublists)
    output = list(case.output)
    cur, cur_labels = operands[0], list(case.sublists[0])
    for k in range(1, len(operands) + 1):
        later = [x for sub in case.sublists[k:] for x in sub] + output
        if k < len(operands):
            nxt, nxt_labels = operands[k], list(case.sublists[k])
        else:  # final pass: reduce to the output order
            nxt, nxt_labels = np.ones((), dtype=np.asarray(cur).dtype), []
        keep = list(dict.fromkeys(x for x in cur_labels + nxt_labels if x in later))
        if k == len(operands):
            keep = output
        step_labels = dict.fromkeys(cur_labels + nxt_labels)
        letter = {lab: string.ascii_letters[i] for i, lab in enumerate(step_labels)}
        eq = "".join(letter[x] for x in cur_labels) + "," + "".join(letter[x] for x in nxt_labels)
        cur = np.einsum(eq + "->" + "".join(letter[x] for x in keep), cur, nxt)
        cur_labels = keep
    return cur


# --------------------------------------------------------------------------------------------------
# derived subsets
# --------------------------------------------------------------------------------------------------
def _max_dim(case: Case) -> int:
    return max((d for s in case.shapes for d in s), default=0)


def _has_zero(case: Case) -> bool:
    return any(d == 0 for s in case.shapes for d in s)


def _pick_blocking_cases(n: int = 40) -> list[Case]:
    """~n cases with dims >= 4 and no zero-size dims, spread round-robin across categories."""
    eligible = [c for c in EQUATIONS if _max_dim(c) >= 4 and not _has_zero(c)]
    by_cat: dict[str, list[Case]] = {}
    for c in eligible:
        by_cat.setdefault(c.category, []).append(c)
    picked: list[Case] = []
    while len(picked) < n and any(by_cat.values()):
        for cat in list(by_cat):
            if by_cat[cat] and len(picked) < n:
                picked.append(by_cat[cat].pop(0))
    return picked


BLOCKING_CASES: list[Case] = _pick_blocking_cases(40)

NARY_OPTIMIZE_CASES: list[Case] = [
    c for c in EQUATIONS
    if c.id in {
        "nary-chain4", "nary-chain6", "nary-tt_reconstruct4", "nary-peps_2x2_open", "nary-star_open",
        "nary-tucker", "nary-batched_chain", "benchmark-mps_product_n3", "benchmark-connected_network",
        "benchmark-hypernetwork_global_dim", "ellipsis-chain3", "shared3-triangle_hyper",
    }
]

CATEGORIES: list[str] = list(dict.fromkeys(c.category for c in EQUATIONS))


def count_by_category() -> dict[str, int]:
    out: dict[str, int] = {}
    for c in EQUATIONS:
        out[c.category] = out.get(c.category, 0) + 1
    return out
