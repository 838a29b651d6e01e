// Package cc is congestion control for RoCEv2 queue pairs: DCQCN (Zhu et
// al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM
// 2015), as the paper's author wrote it for ns-3 (ns3-rdma) and as NVIDIA
// ConnectX exposes it (the rp_/np_ parameters of mlx5), with the
// notification point that turns CE marks into CNPs, the reaction point that
// cuts and recovers a sender's rate, and the token-bucket pacer the sender
// obeys.
//
// Like package qp, cc is sans-IO: every event takes the current time, and
// each component reports when it next needs to be called (Deadline).
// Rates are in bits per second (Rate), sizes in bytes.
package cc
