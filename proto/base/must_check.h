/*
 * must_check.h - the one mark for a function whose result must not be ignored (an error code,
 * an allocation, a count the caller acts on).  Every layer includes it from here, the lowest.
 */
#ifndef TWICE_MUST_CHECK_H
#define TWICE_MUST_CHECK_H

#define TWICE_MUST_CHECK __attribute__((warn_unused_result))

#endif
