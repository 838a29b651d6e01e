package main

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendJSON appends j as encoding/json encodes it (same keys, order,
// omissions and number formats), and a newline: what json.Encoder writes,
// without reflection or allocation. TestDecodeJSONEncoderMatches holds the
// two to the same bytes.
func appendJSON(b []byte, j *jsonPacket) []byte {
	b = append(b, `{"file":`...)
	b = appendJSONString(b, j.File)
	b = append(b, `,"frame":`...)
	b = strconv.AppendInt(b, int64(j.Frame), 10)
	b = append(b, `,"time":`...)
	b = appendJSONFloat(b, j.Time)
	b = append(b, `,"timestamp":`...)
	b = appendJSONTime(b, j.Timestamp)
	b = append(b, `,"src":`...)
	b = appendJSONString(b, j.Src)
	b = append(b, `,"dst":`...)
	b = appendJSONString(b, j.Dst)
	b = appendUint(b, `,"sport":`, uint64(j.SPort))
	b = appendUint(b, `,"dport":`, uint64(j.DPort))
	b = appendUint(b, `,"tos":`, uint64(j.TOS))
	b = append(b, `,"ecn":`...)
	b = appendJSONString(b, j.ECN)
	b = appendUint(b, `,"ttl":`, uint64(j.TTL))
	if j.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, j.Error)
	}
	if j.Opcode != nil {
		b = appendUint(b, `,"opcode":`, uint64(*j.Opcode))
	}
	if j.OpcodeName != "" {
		b = append(b, `,"opcode_name":`...)
		b = appendJSONString(b, j.OpcodeName)
	}
	if j.OpcodeShort != "" {
		b = append(b, `,"opcode_short":`...)
		b = appendJSONString(b, j.OpcodeShort)
	}
	if j.DQPN != nil {
		b = appendUint(b, `,"dqpn":`, uint64(*j.DQPN))
	}
	if j.PSN != nil {
		b = appendUint(b, `,"psn":`, uint64(*j.PSN))
	}
	b = appendBoolPtr(b, `,"ackreq":`, j.AckReq)
	b = appendBoolPtr(b, `,"se":`, j.SE)
	b = appendBoolPtr(b, `,"migreq":`, j.MigReq)
	b = appendBoolPtr(b, `,"fecn":`, j.FECN)
	b = appendBoolPtr(b, `,"becn":`, j.BECN)
	if j.PKey != nil {
		b = appendUint(b, `,"pkey":`, uint64(*j.PKey))
	}
	if j.PadCnt != nil {
		b = appendUint(b, `,"padcnt":`, uint64(*j.PadCnt))
	}
	b = append(b, `,"payload_len":`...)
	b = strconv.AppendInt(b, int64(j.PayloadLen), 10)
	if j.ICRC != "" {
		b = append(b, `,"icrc":`...)
		b = appendJSONString(b, j.ICRC)
	}
	b = append(b, `,"icrc_ok":`...)
	if j.ICRCOK == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendBool(b, *j.ICRCOK)
	}
	if j.Fragments != 0 {
		b = append(b, `,"ip_fragments":`...)
		b = strconv.AppendInt(b, int64(j.Fragments), 10)
	}
	if j.Mark != "" {
		b = append(b, `,"mark":`...)
		b = appendJSONString(b, j.Mark)
	}
	if d := j.DETH; d != nil {
		b = appendUint(b, `,"deth":{"qkey":`, uint64(d.QKey))
		b = appendUint(b, `,"srcqp":`, uint64(d.SrcQP))
		b = append(b, '}')
	}
	if r := j.RETH; r != nil {
		b = appendUintString(b, `,"reth":{"va":`, r.VA)
		b = appendUint(b, `,"rkey":`, uint64(r.RKey))
		b = appendUint(b, `,"dmalen":`, uint64(r.DMALength))
		b = append(b, '}')
	}
	if a := j.AtomicETH; a != nil {
		b = appendUintString(b, `,"atomiceth":{"va":`, a.VA)
		b = appendUint(b, `,"rkey":`, uint64(a.RKey))
		b = appendUintString(b, `,"swap_add":`, a.SwapAdd)
		b = appendUintString(b, `,"compare":`, a.Compare)
		b = append(b, '}')
	}
	if a := j.AETH; a != nil {
		b = appendUint(b, `,"aeth":{"syndrome":`, uint64(a.Syndrome))
		b = appendUint(b, `,"msn":`, uint64(a.MSN))
		b = append(b, `,"kind":`...)
		b = appendJSONString(b, a.Kind)
		b = appendUint(b, `,"value":`, uint64(a.Value))
		b = append(b, '}')
	}
	if a := j.AtomicAck; a != nil {
		b = appendUintString(b, `,"atomicacketh":{"orig":`, a.Orig)
		b = append(b, '}')
	}
	if j.ImmDt != nil {
		b = appendUint(b, `,"immdt":`, uint64(*j.ImmDt))
	}
	if j.IETH != nil {
		b = appendUint(b, `,"ieth":`, uint64(*j.IETH))
	}
	if j.CM != nil {
		b = appendJSONCM(b, j.CM)
	}
	return append(b, "}\n"...)
}

func appendUint(b []byte, key string, v uint64) []byte {
	return strconv.AppendUint(append(b, key...), v, 10)
}

// appendUintString appends a 64-bit field as encoding/json's ",string"
// option writes it: the decimal in quotes.
func appendUintString(b []byte, key string, v uint64) []byte {
	b = strconv.AppendUint(append(append(b, key...), '"'), v, 10)
	return append(b, '"')
}

func appendBoolPtr(b []byte, key string, v *bool) []byte {
	if v == nil {
		return b
	}
	return strconv.AppendBool(append(b, key...), *v)
}

// appendJSONString appends s quoted. Strings of printable ASCII without
// the characters encoding/json escapes are copied; others go through
// encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendJSONFloat formats f as encoding/json does (ES6 number format).
func appendJSONFloat(b []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, "null"...) // encoding/json fails; time offsets are finite
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	n := len(b)
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		if m := len(b) - n; m >= 4 && b[len(b)-4] == 'e' && b[len(b)-3] == '-' && b[len(b)-2] == '0' {
			b[len(b)-2] = b[len(b)-1]
			b = b[:len(b)-1]
		}
	}
	return b
}

// appendJSONTime appends t as time.Time.MarshalJSON does (RFC 3339 with
// nanoseconds, trailing zeros dropped), for years 0-9999.
func appendJSONTime(b []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y > 9999 {
		q, _ := json.Marshal(t)
		return append(b, q...)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
