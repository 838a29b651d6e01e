// Package cc is congestion control for RoCEv2 queue pairs: DCQCN (Zhu et
// al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM
// 2015), as the paper's author wrote it for ns-3 (ns3-rdma) and as NVIDIA
// ConnectX exposes it (the rp_/np_ parameters of mlx5), with the
// notification point that turns CE marks into CNPs, the reaction point that
// cuts and recovers a sender's rate, and the token-bucket pacer the sender
// obeys.
//
// A QP drives one Sender: its Algorithm (the ReactionPoint, or another)
// and its Pacer behind one face, queried with TimeUntilSend and told of
// events with OnPacketSent, OnCNP and OnTimeout. Port is the congestion
// point, a switch egress port (queue, line rate, WRED-ECN, tail drop,
// PFC), the one port model that package transport's networks and cc/sim
// run. Sizes on the wire are counted as bth.WireLen and bth.PacketOverhead
// count them.
//
// Like package qp, cc is sans-IO: every event takes the current time, and
// each component reports when it next needs to be called (Deadline).
// Rates are in bits per second (Rate), sizes in bytes.
package cc
