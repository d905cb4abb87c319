/* diffs.h -- the driver's page diffs, for its page server (diffs.c). */
#ifndef CLAMOR_DIFFS_H
#define CLAMOR_DIFFS_H

#include "internal.h"
#include "wire.h"
#include "zmqdl.h"

/* Replace *body (len bytes: the pages as the request's version reads them)
 * by their diff against the requester's copies, the versions bases[k]
 * (wire.h), if that is shorter (*sent: its length), keeping each page's. */
bool cl_diff_make(cl_zmq_msg *body, size_t len, const struct cl_wire_hdr *rq, const uint32_t *bases, size_t *sent);
/* *body gets the diff of every page of the request from diffs kept, without
 * reading the pages; false if one is not kept or they are no shorter. */
bool cl_diff_kept(const struct cl_wire_hdr *rq, const uint32_t *bases, size_t len, cl_zmq_msg *body, size_t *sent);
void cl_diffs_free(void);

#endif /* CLAMOR_DIFFS_H */
