// Package cm implements the InfiniBand communication manager (IBTA Vol. 1
// chapter 12) as RoCEv2 peers run it over QP1, with the RDMA IP CM
// service of Annex A11 that rdma_cm (librdmacm: rping, perftest -R)
// uses, and Linux's drivers/infiniband/core/cm.c and cma.c as the
// reference for what the specification leaves open.
//
// The codecs: Header (the 24-byte MAD header), the messages REQ, MRA,
// REJ, REP, RTU, DREQ and DREP (each a Message with AppendData and
// DecodeData over the 232 data bytes), AppendMAD and DecodeMAD for a
// whole 256-byte MAD, IPHeader (rdma_cm's private data header) and
// ServiceID.
package cm
